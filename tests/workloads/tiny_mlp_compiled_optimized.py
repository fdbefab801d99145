"""Optimized tiny MLP compiled the way a user types it, `torch.compile(model, mode=...)`: torch.compile builds
Inductor's wrapper itself, so no registered backend sees the graph (the recipes' own shape: reduce-overhead, whose
CUDA graph trees Inductor leaves out on the CPU)."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled by Inductor in a named mode (CUDA graph trees on a GPU)."""
    return torch.compile(model, mode="reduce-overhead")
