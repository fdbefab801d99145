"""A workload whose free recipes misbehave, for the frontier's tests (CPU): under bf16 autocast its forward raises (a
crash the frontier records with its reason); cast whole to bf16 it never returns (a hang the frontier stops at its
time limit)."""

from __future__ import annotations

import time

import torch
from torch import nn


class Hostile(nn.Module):
    """A Linear that raises or hangs as the recipes above say."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("this model refuses autocast")
        if x.dtype == torch.bfloat16:
            while True:
                time.sleep(1)
        return self.fc(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval) and one batch on the CPU."""
    return Hostile().eval(), (torch.randn(4, 8),)
