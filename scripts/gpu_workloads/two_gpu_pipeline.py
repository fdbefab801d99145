"""A plain training script whose model does not fit one GPU's share, split by hand across two GPUs of one process
(the layout `device_map="auto"` gives a Hugging Face model): token embeddings and the first half of the transformer
blocks on `cuda:0`, the second half and the vocabulary head on `cuda:1`, the activations copied between them in the
forward and their gradients in the backward. bfloat16 autocast, AdamW over both halves, argparse and the `__main__`
guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/two_gpu_pipeline.py

With one GPU (or none) both halves share it. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

SIZES = {"gpu": {"vocab": 32000, "width": 1024, "heads": 16, "blocks": 8, "tokens": 512, "batch": 8},
         "small": {"vocab": 50, "width": 16, "heads": 2, "blocks": 2, "tokens": 8, "batch": 2}}


class Block(nn.Module):
    """A pre-norm transformer block: causal SDPA attention and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(n, t, c))
        return x + self.mlp(self.norm2(x))


class SplitLM(nn.Module):
    """Token ids (n, t) -> next-token logits (n, t, vocab), its halves on `first` and `second`."""

    def __init__(self, sizes: dict[str, int], first: torch.device, second: torch.device) -> None:
        super().__init__()
        self.first, self.second = first, second
        half = sizes["blocks"] // 2
        self.embed = nn.Embedding(sizes["vocab"], sizes["width"]).to(first)
        self.lower = nn.Sequential(*(Block(sizes["width"], sizes["heads"]) for _ in range(half))).to(first)
        self.upper = nn.Sequential(*(Block(sizes["width"], sizes["heads"])
                                     for _ in range(sizes["blocks"] - half))).to(second)
        self.norm = nn.LayerNorm(sizes["width"]).to(second)
        self.head = nn.Linear(sizes["width"], sizes["vocab"], bias=False).to(second)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.lower(self.embed(tokens.to(self.first)))
        return self.head(self.norm(self.upper(hidden.to(self.second))))


def main() -> None:
    """Train `--steps` steps on random token batches."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    count = torch.cuda.device_count()
    first = torch.device("cuda:0" if count else "cpu")
    second = torch.device("cuda:1" if count > 1 else first)
    torch.manual_seed(0)
    model = SplitLM(sizes, first, second)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kind = "cuda" if count else "cpu"
    for step in range(args.steps):
        tokens = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["tokens"] + 1))
        with torch.autocast(kind, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten().to(second))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            print(f"step {step + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
