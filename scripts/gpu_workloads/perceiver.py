"""A Perceiver-style encoder (the workload contract), written here: a small array of learned latents reads a long
input through cross-attention, then self-attention blocks work on the latents alone; attention is written by hand
(scores, softmax, weighted sum, no SDPA), with separate query, key and value projections. Random weights, 8 inputs of
4,096 tokens of 128 features read by 256 latents of width 512, eval mode.
"""

from __future__ import annotations

import os

import torch
from torch import nn

SIZES = {"full": {"batch": 8, "tokens": 4096, "features": 128, "latents": 256, "width": 512, "heads": 8, "depth": 6},
         "small": {"batch": 2, "tokens": 32, "features": 8, "latents": 8, "width": 16, "heads": 2, "depth": 2}}


class Attention(nn.Module):
    """Multi-head attention of queries from `x` over keys and values from `context`, written out."""

    def __init__(self, width: int, context_width: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.q, self.k, self.v = (nn.Linear(width, width), nn.Linear(context_width, width),
                                  nn.Linear(context_width, width))
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        m, h = context.shape[1], self.heads
        q = self.q(x).view(b, n, h, c // h).transpose(1, 2)
        k = self.k(context).view(b, m, h, c // h).transpose(1, 2)
        v = self.v(context).view(b, m, h, c // h).transpose(1, 2)
        weights = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, width: int, context_width: int, heads: int) -> None:
        super().__init__()
        self.norm, self.context_norm = nn.LayerNorm(width), nn.LayerNorm(context_width)
        self.attention = Attention(width, context_width, heads)
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        source = self.context_norm(context) if context is not None else self.norm(x)
        x = x + self.attention(self.norm(x), source)
        return x + self.mlp(x)


class Perceiver(nn.Module):
    def __init__(self, features: int, latents: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(latents, width) * 0.02)
        self.read = Block(width, features, heads)
        self.blocks = nn.ModuleList(Block(width, width, heads) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 1000))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.read(self.latents.expand(inputs.shape[0], -1, -1), inputs)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(1))


def scale() -> dict[str, int]:
    """The sizes OPERATOR_PROFILER_EXAMPLE_SCALE names (full unless set)."""
    name = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")
    if name not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be one of {sorted(SIZES)}, not {name!r}")
    return SIZES[name]


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    s = scale()
    model = Perceiver(s["features"], s["latents"], s["width"], s["heads"], s["depth"]).to(device).eval()
    return model, (torch.randn(s["batch"], s["tokens"], s["features"], device=device),)
