"""A workload whose output cancels catastrophically, ((y + 1000) - 1000): run in bf16 the small part is lost, so the
frontier's tests see a recipe that runs and fails validation for every tier, while fp32 keeps the output."""

from __future__ import annotations

import torch
from torch import nn


class Cancelling(nn.Module):
    """Linear, then add and subtract a large constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc(x) + 1000.0) - 1000.0


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval) and one batch on the CPU."""
    return Cancelling().eval(), (torch.randn(4, 8),)
