"""A model whose output barely depends on its input (as a deep, randomly initialised network's may): a large
constant plus a Linear map scaled by 1e-6. Two different inputs give float32 outputs that differ in their last bits
and bfloat16 outputs that are the same."""

from __future__ import annotations

import torch
from torch import nn

WIDTH, OUT, BATCH = 16, 4, 8


class Insensitive(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, OUT)
        self.level = nn.Parameter(torch.full((OUT,), 3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.level + 1e-6 * self.fc(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode) and one input batch, on CUDA when available."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return Insensitive().to(device).eval(), (torch.randn(BATCH, WIDTH, device=device),)
