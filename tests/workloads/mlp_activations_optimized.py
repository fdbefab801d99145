"""Optimized examples/mlp_activations (a demonstration of the contract on a real example, delegating to Inductor).

Its pass rewrites `silu(x)` as `x * sigmoid(x)` (within float32 tolerance; Inductor fuses either form into the
Linear epilogue), then the graph goes to Inductor. Copy it beside examples/mlp_activations/mlp_activations.py,
or run it from here: it finds the example either way.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import fx

try:
    from mlp_activations import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "mlp_activations"))
    from mlp_activations import get_model_and_input  # noqa: F401

BACKEND_NAME = "mlp_activations_opt"
APPLIED_PASSES: dict[str, int] = {}


def silu_to_sigmoid_mul(gm: fx.GraphModule) -> int:
    """Replace `torch.nn.functional.silu(x)` by `x * torch.sigmoid(x)`; return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.nn.functional.silu and not node.kwargs.get("inplace"):
            with gm.graph.inserting_before(node):
                sig = gm.graph.call_function(torch.sigmoid, (node.args[0],))
                mul = gm.graph.call_function(torch.mul, (node.args[0], sig))
            node.replace_all_uses_with(mul)
            gm.graph.erase_node(node)
            count += 1
    gm.recompile()
    return count


@torch._dynamo.register_backend(name=BACKEND_NAME)
def mlp_activations_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Apply the pass, record it, compile with Inductor."""
    from torch._inductor.compile_fx import compile_fx

    applied = silu_to_sigmoid_mul(gm)
    if applied:
        APPLIED_PASSES["silu_to_sigmoid_mul"] = APPLIED_PASSES.get("silu_to_sigmoid_mul", 0) + applied
    return compile_fx(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's backend."""
    return torch.compile(model, backend=BACKEND_NAME)
