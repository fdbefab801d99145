"""Deliberately wrong optimized tiny MLP: its backend is registered but optimize() returns the plain model."""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import get_model_and_input  # noqa: F401 - same model and inputs
from tiny_passes import fuse_mul_add

BACKEND_NAME = "tiny_mlp_wrong_uncalled"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def uncalled_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Never reached."""
    APPLIED_PASSES["fuse_mul_add_to_addcmul"] = fuse_mul_add(gm)
    return gm.forward


def optimize(model: torch.nn.Module) -> Any:
    """Forgets to compile: the 'speedup' of this workload is the baseline's own time."""
    return model
