"""depthwise_separable_conv, optimized for inference on the GPU in the exact tier (evidence:
examples/depthwise_separable_conv/analysis.json, H100).

The window is GPU-bound (busy 92.9 % of 1.604 ms without the profiler), led by memory-bound batch norms.

1. `fold_conv_bn` (functional FX pass, knowledge/fx_patterns/conv_bn_fold.py): the 11 eval-mode batch norms
   (418 us of kernel time) are folded into the preceding convolutions' weights and bias, computed inside the
   graph from the original parameters.
2. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): Inductor fuses the remaining
   element-wise kernels (ReLU6, the 23 fusible kernels of the analysis) and replays the graph as a CUDA graph,
   outputs cloned.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from depthwise_separable_conv import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx
from torch.utils._pytree import tree_map

BACKEND_NAME = "depthwise_separable_conv_opt"
APPLIED_PASSES: dict[str, int] = {}

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


def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def depthwise_separable_conv_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Run this workload's FX passes, record them, and compile with Inductor; on CUDA with CUDA graphs on and the
    outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if applied := fold_conv_bn(gm):
        APPLIED_PASSES["fold_conv_bn"] = APPLIED_PASSES.get("fold_conv_bn", 0) + applied
    gm.recompile()
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's registered backend."""
    return torch.compile(model, backend=BACKEND_NAME)
