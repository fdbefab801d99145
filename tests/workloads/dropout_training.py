"""A model left in training mode (no `.eval()`): its dropout makes every call's output differ (CPU, tiny)."""

from __future__ import annotations

import torch
from torch import nn


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """An MLP with dropout between its layers, in training mode, and one batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 8))
    return model, (torch.randn(16, 32),)
