"""Optimized tiny MLP whose output comes back in bfloat16, as autocast returns it: the reduced tier accepts the
lower-precision dtype (compared after upcasting), the exact tier refuses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs
from tiny_passes import relu_to_functional

BACKEND_NAME = "tiny_mlp_bf16_output"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def bf16_output_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """One real pass; the graph runs as traced."""
    APPLIED_PASSES["relu_to_functional"] = APPLIED_PASSES.get("relu_to_functional", 0) + relu_to_functional(gm)
    return gm.forward


def optimize(model: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The model compiled with this workload's backend, its output returned in bfloat16."""
    compiled = torch.compile(model, backend=BACKEND_NAME)
    return lambda x: compiled(x).to(torch.bfloat16)
