"""moe_topk with each router's softmax, top-k and renormalisation one Triton kernel (`topk_softmax`, a torch.library
op: knowledge/fx_patterns/triton_op.py, imported from the repository), on top of the exact tier's winner
(`torch.compile(mode="reduce-overhead")` in float32), measured against that winner by
`benchmarks/beyond_check.py --tier exact` (the reduced tier has no winner of its own here: every reduced recipe
flipped some tokens' experts and failed validation)."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from cuda_graphs import clone_outputs  # noqa: E402 - the patterns' own code
from moe_topk import MoELayer, get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from triton_op import apply  # noqa: E402

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def fuse_routers(model: torch.nn.Module) -> int:
    """Every MoE layer's `route` replaced, in place, by the one-kernel op; the number replaced."""
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    for layer in layers:
        layer.route = functools.partial(apply, k=layer.k)  # type: ignore[method-assign]
    return len(layers)


def optimize(model: torch.nn.Module, fuse: bool = True) -> Any:
    """The routers fused (unless not `fuse`: the winner alone), compiled with reduce-overhead (CUDA graphs on a GPU);
    each call's output its own (a replay overwrites the graph's output memory: `clone_outputs`)."""
    if fuse:
        APPLIED_PASSES["triton_op"] = fuse_routers(model)
    APPLIED_PASSES["inductor"] = 1
    return clone_outputs(torch.compile(model, mode="reduce-overhead"))
