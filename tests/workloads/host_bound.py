"""A host-bound workload for the frontier's runoff (CPU): its forward waits a fixed 5 ms on the host, then scales its
input, so every recipe runs in about the same time and one process each cannot rank them."""

from __future__ import annotations

import time

import torch
from torch import nn

HOST_WAIT_S = 5e-3


class HostBound(nn.Module):
    """A scale behind a fixed wait on the host (as a Python-heavy forward is)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(HOST_WAIT_S)
        return x * self.scale


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval) and one batch on the CPU."""
    return HostBound().eval(), (torch.randn(8, 16),)
