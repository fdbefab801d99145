"""A ConvNeXt-style image classifier (the workload contract): a patchify stem, four stages of blocks (7x7
depthwise convolution, LayerNorm over channels, a 4x pointwise MLP with GELU, layer scale, residual), downsampling
between stages, global pooling and a linear head. Random weights, 16 images of 224x224."""

from __future__ import annotations

import os

import torch
from torch import nn

SIZES = {"full": {"batch": 16, "side": 224, "dims": (64, 128, 256, 512), "depths": (2, 2, 4, 2)},
         "small": {"batch": 2, "side": 32, "dims": (8, 16, 16, 32), "depths": (1, 1, 1, 1)}}


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.scale = nn.Parameter(torch.full((dim,), 1e-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.mlp(self.norm(y)) * self.scale
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims: tuple[int, ...], depths: tuple[int, ...], classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelNorm(dims[0])]
        for i, (dim, depth) in enumerate(zip(dims, depths, strict=True)):
            if i:
                layers += [ChannelNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
            layers += [Block(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((2, 3))))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model in eval mode and one batch of images, on CUDA when available."""
    size = SIZES[os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ConvNeXt(size["dims"], size["depths"]).to(device).eval()
    return model, (torch.randn(size["batch"], 3, size["side"], size["side"], device=device),)
