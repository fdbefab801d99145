"""Run float32 matmuls and convolutions in bfloat16, inside the graph (FX pass, IR level: functional).

Casts the inputs of every float32 `linear`, `matmul`/`mm`/`bmm` and `conv1d/2d/3d` to bfloat16 and the
result back to float32, so the tensor cores do the work while every other operator, the weights' storage
and the outputs stay float32. This is autocast made explicit and scoped to the compiled graph: it never
touches global settings (`allow_tf32`, `set_float32_matmul_precision`), which the optimized-workload
contract forbids because the baseline would change with them.

When to apply: float32 models on a tensor-core GPU whose GEMMs/convolutions dominate and run on CUDA cores.

Trigger metrics (profile.json): the top operators are `aten::linear`/`aten::addmm`/`aten::mm`/`aten::conv2d`
with `tensor_core_active_pct` ≈ 0 and `flops_by_precision` all `fp32` (kernel metrics `inst_ffma` large,
`flop_tensor_*` = 0), `sm_throughput_pct` high (compute-bound on the FP32 pipe); kernel names without
`gmma`/`hmma`/`tensorop` (e.g. `sgemm`, `..._ffma_...`).

Expected gain: compute-bound GEMMs move from the FP32 pipe (~67 TFLOP/s dense on an H100 SXM) to bf16
tensor cores (~990): 2-8× on those operators in practice, bounded by their share of the window (Amdahl);
the casts add one read+write of each activation, so tiny GEMMs can get slower.
Precision changes: validate at the bfloat16 tolerance (`--tolerance float32=1e-2`) and say so.
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

# Compute-heavy call targets -> positions of their tensor operands (input, weight, bias).
CAST_TARGETS: dict[Any, tuple[int, ...]] = {
    torch._C._nn.linear: (0, 1, 2), F.linear: (0, 1, 2), operator.matmul: (0, 1), torch.matmul: (0, 1),
    torch.mm: (0, 1), torch.bmm: (0, 1), torch.conv1d: (0, 1, 2), torch.conv2d: (0, 1, 2), torch.conv3d: (0, 1, 2),
    F.conv1d: (0, 1, 2), F.conv2d: (0, 1, 2), F.conv3d: (0, 1, 2),
}


def _is_float32(node: Any) -> bool:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return isinstance(value, torch.Tensor) and value.dtype == torch.float32


def cast_compute_to_bf16(gm: fx.GraphModule, dtype: torch.dtype = torch.bfloat16) -> int:
    """Wrap every float32 GEMM/convolution in casts to `dtype` and back; return how many were wrapped."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in CAST_TARGETS or not _is_float32(node):
            continue
        args = list(node.args)
        with graph.inserting_before(node):
            for index in CAST_TARGETS[node.target]:
                if index < len(args) and isinstance(args[index], fx.Node) and _is_float32(args[index]):
                    args[index] = graph.call_method("to", (args[index], dtype))
            if isinstance(node.kwargs.get("bias"), fx.Node):
                node.kwargs = {**node.kwargs, "bias": graph.call_method("to", (node.kwargs["bias"], dtype))}
        node.args = tuple(args)
        with graph.inserting_after(node):
            back = graph.call_method("to", (node, torch.float32))
        node.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count
