"""A workload whose model's lazy modules are not initialised when get_model_and_input() returns it (CPU)."""

from __future__ import annotations

import torch
from torch import nn


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """LazyLinears, never called: their weights have no shape yet."""
    return nn.Sequential(nn.LazyLinear(32), nn.ReLU(), nn.LazyLinear(8)).eval(), (torch.randn(4, 16),)
