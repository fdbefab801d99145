"""Deliberately wrong optimized tiny MLP: it returns a fresh copy of the first call's output on every call (new
memory, old values)."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs

RECIPE = "eager+fp32"


def optimize(model: torch.nn.Module) -> Any:
    """The model, its first result copied out on every later call."""
    cache: dict[str, torch.Tensor] = {}

    def run(x: torch.Tensor) -> torch.Tensor:
        if "out" not in cache:
            cache["out"] = model(x)
        return cache["out"].clone()

    return run
