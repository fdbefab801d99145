"""An MLP whose forward breaks the torch.compile graph twice: a `.item()` read and a `print` between its
blocks, so a compiled run holds several graphs (batch 1024 of width 4096; `small`: 4 of 32)."""

from __future__ import annotations

import os

import torch
from torch import nn


class Broken(nn.Module):
    """Three Linear+ReLU blocks; between them a data-dependent scale read with `.item()`, and a print."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.second = nn.Sequential(nn.Linear(width, width), nn.ReLU())
        self.third = nn.Sequential(nn.Linear(width, width), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        scale = x.abs().mean().item()  # graph break: a Python float from the GPU
        x = self.second(x / (1.0 + scale))
        print("graph_breaks: between the second and third block")  # graph break: a side effect
        return self.third(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model and one input batch, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    width, batch = (32, 4) if small else (4096, 1024)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Broken(width).to(device).eval(), (torch.randn(batch, width, device=device),)
