"""Deliberately wrong optimized tiny MLP: its pass scales the output by 1.01 (beyond the fp32 tolerance)."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs
from tiny_passes import relu_to_functional, scale_outputs

BACKEND_NAME = "tiny_mlp_wrong_numerics"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def wrong_numerics_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A real pass plus a wrong one."""
    APPLIED_PASSES["relu_to_functional"] = APPLIED_PASSES.get("relu_to_functional", 0) + relu_to_functional(gm)
    APPLIED_PASSES["scale_outputs"] = APPLIED_PASSES.get("scale_outputs", 0) + scale_outputs(gm, 1.01)
    return gm.forward


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
