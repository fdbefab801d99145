"""Fuse parallel linear projections of one input into a single GEMM (FX pass, IR level: functional).

When to apply: attention blocks with separate `q`, `k`, `v` `nn.Linear` layers reading the same hidden
states (and any other group of linears sharing an input, e.g. gate/up projections of a gated MLP).

Trigger metrics (profile.json): three (or more) `aten::linear`/`aten::addmm` calls under sibling modules
(`attn.q_proj`, `attn.k_proj`, `attn.v_proj`) with the same input shape, each small enough that the GEMM is
under-filled: `achieved_occupancy_pct` low, `sm_throughput_pct` < 60, `waves_per_sm` < 1, short durations
(tens of µs or less); one launch per projection in `kernel_count`.

Expected gain: one GEMM with N = sum of the output widths instead of three launches that each re-read the
input: up to the three projections' time × (1 - 1/3) when launch- or wave-bound; little for GEMMs that
already saturate the GPU. The concatenated weights are built inside the graph each call (a copy of the
weights), which costs DRAM bytes ≈ the weights' size: worth it when activations dominate.

Parameters stay graph inputs (the weights are concatenated in the graph, never baked in). Outputs are the
matching slices of the fused result (views of one tensor).
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

import operator
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import fx

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
