"""A model whose inputs are nested: a list of two tensors, a dict holding a tensor, and a Python int (CPU, tiny)."""

from __future__ import annotations

import torch
from torch import nn


class Nested(nn.Module):
    """Two Linears over the pair, scaled by the int, plus the dict's bias."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, pair: list[torch.Tensor], extra: dict[str, torch.Tensor], scale: int) -> torch.Tensor:
        x, y = pair
        return self.a(x) * scale + self.b(y) + extra["bias"]


def get_model_and_input() -> tuple[nn.Module, tuple[object, ...]]:
    """The model (eval) and its nested inputs on the CPU."""
    torch.manual_seed(0)
    return Nested().eval(), ([torch.randn(4, 16), torch.randn(4, 16)], {"bias": torch.randn(16)}, 3)
