"""Deliberately wrong optimized tiny MLP: its pass clamps the caller's input in place (after using it)."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs
from tiny_passes import mutate_inputs, relu_to_functional

BACKEND_NAME = "tiny_mlp_wrong_mutation"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def mutating_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A real pass plus one that writes to the inputs; the outputs stay right."""
    APPLIED_PASSES["relu_to_functional"] = APPLIED_PASSES.get("relu_to_functional", 0) + relu_to_functional(gm)
    APPLIED_PASSES["mutate_inputs"] = APPLIED_PASSES.get("mutate_inputs", 0) + mutate_inputs(gm, example_inputs)
    return gm.forward


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
