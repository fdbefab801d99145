"""sdpa_attention, optimized for inference on the GPU in the reduced precision tier (evidence:
examples/sdpa_attention/analysis.json, H100).

The window is compute-bound (GPU busy 94.4 % of 2.605 ms without the profiler): four FP32 GEMMs on CUDA cores
(1.42 ms) and the attention kernel. Its speed of light with FP16/BF16 tensor cores is 0.222 ms.

1. `fp16_weights` (module level, knowledge/fx_patterns/fp16_weights.py): the Linear weights are stored in
   float16 once and each call runs under float16 autocast: the projections run on FP16 tensor cores, the
   attention kernel on float16 q, k and v, and no kernel re-casts a weight per call (the free bf16-autocast
   recipe does). The output stays in float16, as autocast returns it (`with_autocast_keep_dtype`; the reduced
   tier accepts it): no cast pass over it.
2. `qkv_fusion` (functional FX pass, knowledge/fx_patterns/qkv_fusion.py): the separate q, k and v projections of
   one input (finding `separate_qkv`) become one GEMM over the concatenated weights and a split.
3. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): Inductor compiles the rewritten graph
   and replays it as a CUDA graph, outputs cloned (16.8 MB of float16 per call).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from sdpa_attention import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx, nn
from torch.utils._pytree import tree_map

BACKEND_NAME = "sdpa_attention_opt"
APPLIED_PASSES: dict[str, int] = {}

MATMUL_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)


def cast_matmul_weights(model: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """The same model with the parameters of its Linear and convolution modules stored in `dtype` once, in
    place; every other parameter and buffer (norms, embeddings not tied to a Linear) keeps its dtype."""
    for module in model.modules():
        if isinstance(module, MATMUL_MODULES):
            module.to(dtype)
    return model


def with_autocast_keep_dtype(fn: Callable[..., Any], dtype: torch.dtype = torch.float16) -> Callable[..., Any]:
    """`fn` run under `torch.autocast(dtype=dtype)` on the device of its tensor arguments (CUDA when any is on
    CUDA, else CPU); outputs as autocast returns them, those it computed in `dtype` left in `dtype`: no cast pass
    over a large output. The reduced tier accepts a float32 output returned in float16 or bfloat16."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            return fn(*args, **kwargs)

    return run


def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run


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
    """Run this workload's FX passes and record them; compile with Inductor, on CUDA with CUDA graphs on and the
    outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if applied := fuse_parallel_linears(gm):
        APPLIED_PASSES["qkv_fusion"] = APPLIED_PASSES.get("qkv_fusion", 0) + applied
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model, its Linear weights stored in float16 once, compiled with this workload's registered backend and
    run under float16 autocast (output returned in float16)."""
    cast_matmul_weights(model)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return with_autocast_keep_dtype(torch.compile(model, backend=BACKEND_NAME))
