"""A model that changes its input in place before using it (CPU, tiny)."""

from __future__ import annotations

import torch
from torch import nn


class Doubling(nn.Module):
    """Doubles its input in place, then a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.linear(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model (eval) and one batch, on the CPU."""
    torch.manual_seed(0)
    return Doubling().eval(), (torch.randn(4, 16),)
