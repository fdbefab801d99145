"""Optimized tiny recommender (correct): the same model compiled with a backend that records it ran and delegates to
`aot_eager` (docs/optimized-workload-contract.md). Its inputs carry structure that a perturbed copy breaks."""

from __future__ import annotations

from typing import Any

import torch
from tiny_bag import TinyBag, get_model_and_input  # noqa: F401 - re-exported: same model and inputs

BACKEND_NAME = "tiny_bag_opt"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def tiny_bag_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Record the compile, delegate to aot_eager."""
    APPLIED_PASSES["aot_eager"] = APPLIED_PASSES.get("aot_eager", 0) + 1
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
