"""Deliberately wrong optimized tiny MLP: its backend returns the first call's output on every call."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs
from tiny_passes import relu_to_functional

BACKEND_NAME = "tiny_mlp_wrong_cached"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def cached_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Memoize the graph's result: the bug that makes a benchmark look infinitely fast."""
    APPLIED_PASSES["relu_to_functional"] = APPLIED_PASSES.get("relu_to_functional", 0) + relu_to_functional(gm)
    APPLIED_PASSES["memoize_outputs"] = APPLIED_PASSES.get("memoize_outputs", 0) + 1
    cache: dict[str, Any] = {}

    def run(*args: Any) -> Any:
        if "out" not in cache:
            cache["out"] = gm.forward(*args)
        return cache["out"]

    return run


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
