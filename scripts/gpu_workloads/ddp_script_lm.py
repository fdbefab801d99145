"""A language model's data-parallel training script as people write it for torchrun, with nothing of Operator
Profiler in it:

    torchrun --nproc-per-node 2 ddp_script_lm.py --epochs 2
    operator-profiler run --script ddp_script_lm.py --nproc-per-node 2 -- --epochs 2

Each rank joins the process group from torchrun's environment, reads its shard of a token dataset through a
`DistributedSampler` and a DataLoader, trains a GPT-style model (6 causal blocks, d_model 768) wrapped in DDP under
bf16 autocast, and accumulates gradients over two micro-batches per optimizer step, the first under `no_sync()`
(DDP all-reduces only on the second). Rank 0 logs the loss every few steps (a `.item()`, which waits for the GPU).
`--small` (or OPERATOR_PROFILER_EXAMPLE_SCALE=small) shrinks it for a CPU machine (gloo).
"""

import argparse
import os

import torch
import torch.distributed as dist
from ddp_lm_train import Block  # the same pre-norm causal block
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Tokens(Dataset):
    """Random token sequences; the target is the sequence shifted by one."""

    def __init__(self, count: int, seq: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (count, seq + 1), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.data[index]
        return row[:-1], row[1:]


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main(args: argparse.Namespace) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    small = args.small or os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    vocab, seq, d_model, heads, layers, batch = (
        (256, 16, 32, 2, 2, 2) if small else (8192, 512, 768, 12, 6, 8))
    dataset = Tokens(64 if small else 512, seq, vocab)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=args.workers, pin_memory=cuda,
                        drop_last=True)
    model = DistributedDataParallel(LanguageModel(vocab, seq, d_model, heads, layers).to(device),
                                    device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for first, second in zip(batches, batches, strict=False):  # two micro-batches per optimizer step
            for micro, (ids, targets) in enumerate((first, second)):
                ids, targets = ids.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                sync = model.no_sync() if micro == 0 else torch.enable_grad()
                with sync, torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    loss = loss_fn(model(ids).flatten(0, 1), targets.flatten()) / 2
                    loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if dist.get_rank() == 0 and step % args.log_every == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item() * 2:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="a model and data small enough for a CPU machine")
    main(parser.parse_args())
