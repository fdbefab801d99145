"""A plain serving script that runs a model as `torch.export` hands it over: a small text encoder (token and position
embeddings, pre-norm transformer blocks of the script's own attention, a classifier on the mean token) is exported once
with `torch.export.export`, and its `.module()` (an FX GraphModule whose code calls aten operators directly, no
submodule's forward running) answers batches of requests under `torch.inference_mode()`. argparse and the `__main__`
guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/exported_serve.py --window-fn serve --steps 2:2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

SIZES = {"gpu": {"width": 512, "heads": 8, "blocks": 4, "tokens": 128, "batch": 32, "vocab": 30000, "classes": 20},
         "small": {"width": 16, "heads": 2, "blocks": 2, "tokens": 8, "batch": 2, "vocab": 100, "classes": 3}}


class Attention(nn.Module):
    """Multi-head self-attention written out: one QKV projection, SDPA, an output projection."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, c = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(attended.transpose(1, 2).reshape(n, t, c))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each added to its input."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TextEncoder(nn.Module):
    """Token ids (n, t) -> class logits (n, classes)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        self.tokens = nn.Embedding(sizes["vocab"], sizes["width"])
        self.positions = nn.Parameter(torch.zeros(1, sizes["tokens"], sizes["width"]))
        self.blocks = nn.Sequential(*(Block(sizes["width"], sizes["heads"]) for _ in range(sizes["blocks"])))
        self.norm = nn.LayerNorm(sizes["width"])
        self.classify = nn.Linear(sizes["width"], sizes["classes"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.tokens(ids) + self.positions)
        return self.classify(self.norm(x).mean(dim=1))


def serve(program: nn.Module, requests: torch.Tensor) -> list[int]:
    """Answer one batch of requests: each one's class."""
    with torch.inference_mode():
        return program(requests).argmax(dim=1).tolist()


def main() -> None:
    """Export the encoder once, then serve `--batches` batches with the exported program."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TextEncoder(sizes).to(device).eval()
    example = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["tokens"]), device=device)
    program = torch.export.export(model, (example,)).module()
    answered = 0
    for _ in range(args.batches):
        requests = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["tokens"]), device=device)
        answered += len(serve(program, requests))
    print(f"answered {answered} requests")


if __name__ == "__main__":
    main()
