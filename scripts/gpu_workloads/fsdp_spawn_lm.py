"""A language model sharded with FSDP2 by a training script that starts its own ranks with
`torch.multiprocessing.spawn`, with nothing of Operator Profiler in it:

    python fsdp_spawn_lm.py --steps 16
    operator-profiler run --script fsdp_spawn_lm.py -- --steps 16

Each spawned rank shards every block of a GPT-style model (6 causal blocks, d_model 768) and then the root with
`fully_shard` under a bf16 mixed-precision policy (parameters gathered in bf16, gradients reduced in fp32), clips
the gradients' global norm (a DTensor reduction across the ranks) and steps AdamW over its shards.
`--small` (or OPERATOR_PROFILER_EXAMPLE_SCALE=small) shrinks it for a CPU machine (gloo, fp32).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from ddp_lm_train import Block  # the same pre-norm causal block
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def worker(rank: int, world_size: int, args: argparse.Namespace) -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ["MASTER_PORT"] = str(args.port)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    small = args.small or os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    vocab, seq, d_model, heads, layers, batch = (256, 16, 32, 2, 2, 2) if small else (8192, 512, 768, 12, 6, 8)
    torch.manual_seed(0)
    model = LanguageModel(vocab, seq, d_model, heads, layers).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else \
        MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator(device=device).manual_seed(rank)
    for step in range(args.steps):
        ids = torch.randint(0, vocab, (batch, seq + 1), device=device, generator=generator)
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and (step + 1) % 8 == 0:
            print(f"step {step + 1}: loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--port", type=int, default=29561)
    parser.add_argument("--small", action="store_true", help="a model small enough for a CPU machine")
    options = parser.parse_args()
    world = torch.cuda.device_count() if torch.cuda.is_available() else 2
    mp.spawn(worker, args=(world, options), nprocs=world, join=True)
