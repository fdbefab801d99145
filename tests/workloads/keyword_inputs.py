"""A model taking keyword inputs (get_model_and_input() returns a dict) and returning a dict with a None in it (CPU)."""

from __future__ import annotations

import torch
from torch import nn


class Keywords(nn.Module):
    """A convolution, masked, pooled into a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, image: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
        y = self.conv(image).relu()
        if mask is not None:
            y = y * mask
        return {"logits": self.head(y.mean((2, 3))), "aux": None}


def get_model_and_input() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model (eval) and its inputs by keyword, on the CPU."""
    torch.manual_seed(0)
    return Keywords().eval(), {"image": torch.randn(2, 3, 16, 16), "mask": torch.ones(2, 1, 16, 16)}
