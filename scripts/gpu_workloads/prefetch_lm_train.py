"""A plain training script for a GPT-style language model that overlaps its input copies with compute: batches of
tokens wait in pinned host memory and a side CUDA stream copies the next one while the current step runs
(`wait_stream`, `record_stream`); every block is checkpointed (`torch.utils.checkpoint`, non-reentrant), so its
forward runs again inside the backward; bfloat16 autocast, gradient clipping, fused AdamW, a warm-up learning-rate
schedule, and the loss read back to the host every ten steps. argparse and the `__main__` guard; nothing of
Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/prefetch_lm_train.py

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

SIZES = {"gpu": {"width": 512, "heads": 8, "depth": 6, "seq": 256, "batch": 16, "vocab": 8192},
         "small": {"width": 32, "heads": 2, "depth": 2, "seq": 16, "batch": 2, "vocab": 64}}


class Block(nn.Module):
    """Pre-norm attention (through SDPA, causal) and an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, depth: int, seq: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.training else block(x)
        return self.head(self.norm(x))


class Prefetcher:
    """Pinned host batches copied to the device one step ahead, on a side stream."""

    def __init__(self, batches: list[torch.Tensor], device: str) -> None:
        self.batches, self.device = batches, device
        self.stream = torch.cuda.Stream() if device == "cuda" else None
        self.index = 0
        self.ready = self._copy()

    def _copy(self) -> torch.Tensor:
        host = self.batches[self.index % len(self.batches)]
        self.index += 1
        if self.stream is None:
            return host.to(self.device)
        with torch.cuda.stream(self.stream):
            return host.to(self.device, non_blocking=True)

    def next(self) -> torch.Tensor:
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
            self.ready.record_stream(torch.cuda.current_stream())
        batch, self.ready = self.ready, self._copy()
        return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps of linear learning-rate warm-up")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    torch.manual_seed(0)
    model = LanguageModel(sizes["vocab"], sizes["width"], sizes["heads"], sizes["depth"], sizes["seq"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    host = [torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["seq"] + 1)) for _ in range(4)]
    batches = Prefetcher([b.pin_memory() if device == "cuda" else b for b in host], device)
    model.train()
    for step in range(args.steps):
        tokens = batches.next()
        with torch.autocast(device, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
