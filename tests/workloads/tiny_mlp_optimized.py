"""Optimized tiny MLP (correct): an FX backend that rewrites torch.relu and fuses mul + add into addcmul.

Follows docs/optimized-workload-contract.md: same model and inputs as the baseline (imported from it), a
registered torch.compile backend named BACKEND_NAME that records the passes it applied in APPLIED_PASSES and
delegates to `aot_eager` (cheap on a CPU; a GPU workload would delegate to inductor), and optimize(model).
"""

from __future__ import annotations

from typing import Any

import torch
from tiny_mlp import TinyMLP, get_model_and_input  # noqa: F401 - re-exported: same model and inputs
from tiny_passes import fuse_mul_add, relu_to_functional

BACKEND_NAME = "tiny_mlp_opt"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def tiny_mlp_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Apply the FX passes, record them, delegate to aot_eager."""
    for name, fx_pass in (("relu_to_functional", relu_to_functional), ("fuse_mul_add_to_addcmul", fuse_mul_add)):
        applied = fx_pass(gm)
        if applied:
            APPLIED_PASSES[name] = APPLIED_PASSES.get(name, 0) + applied
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
