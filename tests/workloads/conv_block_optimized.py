"""Optimized examples/conv_block (a demonstration of the contract on a real example, delegating to Inductor).

Its pass turns the in-place ReLUs (`relu(x, inplace=True)`) out of place, which leaves Inductor free to fuse
them with the batch norm without a mutation in the graph; numerically identical. Copy it beside
examples/conv_block/conv_block.py, or run it from here: it finds the example either way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import fx

try:
    from conv_block import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "conv_block"))
    from conv_block import get_model_and_input  # noqa: F401

BACKEND_NAME = "conv_block_opt"
APPLIED_PASSES: dict[str, int] = {}


def relu_out_of_place(gm: fx.GraphModule) -> int:
    """Set `inplace=False` on every in-place `relu`; return how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.nn.functional.relu and node.kwargs.get("inplace"):
            node.kwargs = {**node.kwargs, "inplace": False}
            count += 1
    gm.recompile()
    return count


@torch._dynamo.register_backend(name=BACKEND_NAME)
def conv_block_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Apply the pass, record it, compile with Inductor."""
    from torch._inductor.compile_fx import compile_fx

    applied = relu_out_of_place(gm)
    if applied:
        APPLIED_PASSES["relu_out_of_place"] = APPLIED_PASSES.get("relu_out_of_place", 0) + applied
    return compile_fx(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
