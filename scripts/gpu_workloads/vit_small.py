"""A small vision transformer (patch embedding by a strided conv, a class token, 6 pre-norm blocks of width 384
with 6 heads through nn.MultiheadAttention, a linear head) on 32 images of 3x224x224 in eval mode (`small`: 2 blocks
of width 64 on 2 images of 32x32): a transformer none of the examples is."""

from __future__ import annotations

import os

import torch
from torch import nn


class Block(nn.Module):
    """Pre-norm multi-head self-attention and MLP, each with its residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Patches, a class token and positions, the blocks, a final norm and the classifier on the class token."""

    def __init__(self, side: int, patch: int, width: int, heads: int, depth: int, classes: int = 1000) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, width) * 0.02)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(depth)))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), tokens], dim=1) + self.positions
        return self.head(self.ln(self.blocks(tokens))[:, 0])


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and its input batch, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, side, width, heads, depth = (2, 32, 64, 4, 2) if small else (32, 224, 384, 6, 6)
    model = ViT(side, 16 if not small else 8, width, heads, depth).eval().to(device)
    return model, (torch.randn(batch, 3, side, side, device=device),)
