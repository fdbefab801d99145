"""sdpa_attention, optimized for inference on the GPU in the exact tier (evidence:
examples/sdpa_attention/analysis.json, H100).

The window is compute-bound (GPU busy 94.4 % of 2.605 ms without the profiler): four FP32 GEMMs on CUDA cores
(1.42 ms) and the attention kernel. The exact tier keeps them in float32, so what is left is:

1. `qkv_fusion` (functional FX pass, knowledge/fx_patterns/qkv_fusion.py): the separate q, k and v projections of
   one input (finding `separate_qkv`) become one GEMM over the concatenated weights and a split.
2. Inductor compiles the rewritten graph with its default options.

Not applied: CUDA graphs (knowledge/fx_patterns/cuda_graphs.py). Measured on the H100 against the best free recipe
(`torch.compile`, 2.47 ms): 0.980x (95 % CI 0.979-0.980) with CUDA graphs on and the outputs cloned, 1.001x
(0.999-1.001) without. The window is GPU-bound, so a graph removes almost no idle time, while cloning the 33.5 MB
output costs a pass over it every call.

Moving the GEMMs to tensor cores (the analysis's only opportunity, 1.29 ms) needs the reduced tier.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from sdpa_attention import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx

BACKEND_NAME = "sdpa_attention_opt"
APPLIED_PASSES: dict[str, int] = {}

LINEAR_TARGETS = (torch._C._nn.linear, F.linear)


def _linear_parts(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node | None] | None:
    """(input, weight, bias) of a linear call whose weight shape Dynamo recorded; None otherwise."""
    if node.op != "call_function" or node.target not in LINEAR_TARGETS:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    x, weight, bias = args[0], args[1], node.kwargs.get("bias", args[2])
    if not isinstance(x, fx.Node) or not isinstance(weight, fx.Node):
        return None
    value = weight.meta.get("example_value")
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        return None
    return x, weight, bias if isinstance(bias, fx.Node) else None


def fuse_parallel_linears(gm: fx.GraphModule, min_group: int = 2) -> int:
    """Replace each group of at least `min_group` linears reading the same input (all with a bias or all
    without, same weight dtype) by one linear over the concatenated weights and a split; return the number
    of groups fused."""
    graph = gm.graph
    groups: dict[tuple[fx.Node, bool, torch.dtype], list[fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        parts = _linear_parts(node)
        if parts is not None:
            x, weight, bias = parts
            groups[(x, bias is not None, weight.meta["example_value"].dtype)].append(node)
    order = {node: i for i, node in enumerate(graph.nodes)}
    fused = 0
    for (x, has_bias, _), linears in groups.items():
        operands = [p for n in linears for p in _linear_parts(n)[1:] if p is not None]
        if len(linears) < min_group or any(order[p] > order[linears[0]] for p in operands):
            continue
        weights = [node.args[1] for node in linears]
        widths = [int(w.meta["example_value"].shape[0]) for w in weights]
        with graph.inserting_before(linears[0]):
            weight = graph.call_function(torch.cat, (weights, 0))
            bias = graph.call_function(torch.cat, ([_linear_parts(n)[2] for n in linears], 0)) if has_bias else None
            out = graph.call_function(F.linear, (x, weight, bias))
            pieces = graph.call_function(torch.split, (out, widths, -1))
            slices = [graph.call_function(operator.getitem, (pieces, i)) for i in range(len(linears))]
        for node, piece in zip(linears, slices, strict=True):
            piece.meta.update(node.meta)
            node.replace_all_uses_with(piece)
            graph.erase_node(node)
        fused += 1
    if fused:
        graph.lint()
        gm.recompile()
    return fused


@torch._dynamo.register_backend(name=BACKEND_NAME)
def sdpa_attention_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Run this workload's FX passes, record them, and compile with Inductor's default options."""
    from torch._inductor.compile_fx import compile_fx

    if applied := fuse_parallel_linears(gm):
        APPLIED_PASSES["qkv_fusion"] = APPLIED_PASSES.get("qkv_fusion", 0) + applied
    gm.recompile()
    return compile_fx(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's registered backend."""
    return torch.compile(model, backend=BACKEND_NAME)
