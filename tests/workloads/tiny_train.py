"""A two-layer MLP and its training step: the smallest workload whose forward and backward Inductor compiles.

`layers.0` and `layers.2` are Linear layers with a GELU (`layers.1`) between them; `train_step` is one forward and
backward pass.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH, HIDDEN, BATCH = 16, 32, 8


class TinyTrain(nn.Module):
    """layers: Linear -> GELU -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model and one input batch, on CUDA when available."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return TinyTrain().to(device), (torch.randn(BATCH, WIDTH, device=device),)


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One forward and backward pass with a scalar loss (no optimizer step)."""
    loss = model(*inputs).pow(2).mean()
    loss.backward()
    return loss
