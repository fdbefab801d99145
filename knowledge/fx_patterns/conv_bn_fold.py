"""Fold an inference BatchNorm into the convolution that feeds it (FX pass, IR level: functional).

When to apply: an eval-mode model with Conv -> BatchNorm (VGG, ResNet, MobileNet blocks) where the batch norm
runs as its own kernel after each convolution (eager), or as a separate pass Inductor could not fold.

Trigger metrics (profile.json): `aten::batch_norm` operators holding a visible share of kernel time (say > 5 %)
right after `aten::conv2d` in the same module; their kernels memory-bound: `dram_throughput_pct` or
`memory_throughput_pct` far above `sm_throughput_pct`, `arithmetic_intensity_flop_per_byte` < 1; one extra
kernel per convolution in `kernel_count`.

Expected gain: the batch norm kernels' time disappears (one read and one write of every convolution output),
minus a few tiny kernels that scale the weights. Under Inductor the batch norm is already fused into the
pointwise kernel of a following ReLU, so the fold saves no traffic there while the folded weights are recomputed
on every call: measured on the H100 (depthwise_separable_conv, Inductor + CUDA graphs) 0.978x the free recipe
with the fold, 0.997x without. Propose it for eager or non-Inductor backends, or where no element-wise op
follows the batch norm.

Parameters stay graph inputs: the folded weight `w * gamma / sqrt(var + eps)` and bias
`(b - mean) * gamma / sqrt(var + eps) + beta` are computed inside the graph from the placeholders, so no
value is baked in and reloading weights keeps working. Only `training=False` batch norms are folded.
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

# Convolution call targets in Dynamo's graph -> number of spatial dimensions.
CONV_TARGETS: dict[Any, int] = {
    torch.conv1d: 1, F.conv1d: 1, torch.conv2d: 2, F.conv2d: 2, torch.conv3d: 3, F.conv3d: 3,
}
CONV_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
BN_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
BN_DEFAULTS: dict[str, Any] = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def _bind(node: fx.Node, names: tuple[str, ...], defaults: dict[str, Any]) -> dict[str, Any]:
    bound = {**defaults, **dict(zip(names, node.args, strict=False))}
    bound.update(node.kwargs)
    return bound


def fold_conv_bn(gm: fx.GraphModule) -> int:
    """Replace every `batch_norm(conv(x, w, b), mean, var, gamma, beta, training=False)` whose convolution
    output feeds only the batch norm by `conv(x, w', b')`; return how many were folded."""
    graph = gm.graph
    folded = 0
    for bn in list(graph.nodes):
        if bn.op != "call_function" or bn.target is not F.batch_norm:
            continue
        norm = _bind(bn, BN_PARAMS, BN_DEFAULTS)
        conv = norm["input"]
        if norm["training"] is not False or not isinstance(conv, fx.Node) or conv.op != "call_function":
            continue
        if conv.target not in CONV_TARGETS or len(conv.users) != 1:
            continue
        if not isinstance(norm["running_mean"], fx.Node) or not isinstance(norm["running_var"], fx.Node):
            continue
        args = _bind(conv, CONV_PARAMS, {"bias": None})
        shape = [-1] + [1] * (CONV_TARGETS[conv.target] + 1)
        with graph.inserting_before(conv):
            inv_std = graph.call_function(torch.rsqrt, (graph.call_function(operator.add,
                                                                            (norm["running_var"], norm["eps"])),))
            scale = inv_std if norm["weight"] is None else graph.call_function(operator.mul, (norm["weight"], inv_std))
            weight = graph.call_function(operator.mul, (args["weight"], graph.call_method("reshape", (scale, shape))))
            centered = graph.call_function(operator.neg, (norm["running_mean"],)) if args["bias"] is None else \
                graph.call_function(operator.sub, (args["bias"], norm["running_mean"]))
            bias = graph.call_function(operator.mul, (centered, scale))
            if norm["bias"] is not None:
                bias = graph.call_function(operator.add, (bias, norm["bias"]))
            rest = {k: args[k] for k in CONV_PARAMS[3:] if k in args}
            new_conv = graph.call_function(conv.target, (args["input"], weight, bias), rest)
        new_conv.meta.update(conv.meta)  # the convolution's module owns the folded op
        bn.replace_all_uses_with(new_conv)
        graph.erase_node(bn)
        graph.erase_node(conv)
        folded += 1
    if folded:
        graph.lint()
        gm.recompile()
    return folded
