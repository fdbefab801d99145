"""A small CNN's forward (four conv-BN-ReLU stages, pooling, a linear head) on 64 images of 3x128x128: the memory
pass's eager inference workload (`small`: 2 images of 3x16x16)."""

from __future__ import annotations

import os

import torch
from torch import nn


def _stage(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    """`stages.N` (conv, BN, ReLU, pool), global average pooling, `head`."""

    def __init__(self, classes: int = 100) -> None:
        super().__init__()
        self.stages = nn.Sequential(_stage(3, 32), _stage(32, 64), _stage(64, 128), _stage(128, 256))
        self.head = nn.Linear(256, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(x).mean(dim=(2, 3)))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The CNN in eval mode and a batch of images."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    batch, side = (2, 16) if small else (64, 128)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return SmallCNN().to(device).eval(), (torch.randn(batch, 3, side, side, device=device),)
