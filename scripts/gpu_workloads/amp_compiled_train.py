"""A plain training script of the kind most people write today: a small GPT-style language model wrapped in
`torch.compile`, mixed precision through `torch.autocast(float16)` with a `GradScaler`, a fused AdamW, a cosine
learning-rate schedule, token batches from a DataLoader; argparse and the `__main__` guard; nothing of Operator
Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/amp_compiled_train.py -- --steps 40 [--mode reduce-overhead]

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (2 layers of width 64, 32 tokens) for a CPU run.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomTokens(Dataset):
    """Token sequences drawn from a generator seeded per item (the same data in every run)."""

    def __init__(self, count: int, length: int, vocab: int) -> None:
        self.count, self.length, self.vocab = count, length, vocab

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.randint(self.vocab, (self.length + 1,), generator=torch.Generator().manual_seed(index))


class Block(nn.Module):
    """Pre-norm causal self-attention (SDPA) and a GELU MLP, each with its residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, the blocks, a final norm and the vocabulary head."""

    def __init__(self, vocab: int, length: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches) to run")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--no-compile", action="store_true", help="train the model eagerly")
    parser.add_argument("--mode", default="default", help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    args = parser.parse_args()
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab, length, width, heads, depth = (256, 32, 64, 4, 2) if small else (8192, 512, 512, 8, 6)
    model = TinyGPT(vocab, length, width, heads, depth).to(device)
    compiled = model if args.no_compile else torch.compile(model, mode=args.mode)
    loader = DataLoader(RandomTokens(args.steps * args.batch_size, length, vocab), batch_size=args.batch_size,
                        num_workers=args.workers, pin_memory=device == "cuda", drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=device == "cuda")
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    model.train()
    for step, batch in enumerate(loader):
        batch = batch.to(device, non_blocking=True)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16):
            logits = compiled(inputs)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
