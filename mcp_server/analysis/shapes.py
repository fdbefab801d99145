"""Model FLOPs and minimum bytes of a GEMM operator from its recorded input shapes.

Used where kernels carry no counters (torch backend) to bound what a precision change can save: a GEMM of
M x N x K does 2*M*N*K FLOPs and must at least read its operands and write its result once. FLOPs cover the GEMM
family only (linear, mm, addmm, bmm, matmul); a convolution's need its stride and padding, which shapes lack, but it
must at least read its input and its weight once: that lower bound of its bytes holds without them.
"""

from __future__ import annotations

from math import prod

from mcp_server.schema.profile import OperatorRecord

_ELEMENT_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "c10::half": 2, "half": 2, "float16": 2,
                  "c10::bfloat16": 2, "bfloat16": 2}


def element_bytes(dtype: str | None) -> int:
    """Bytes per element of a dtype name as torch records it (float, c10::Half, ...); 4 when unknown."""
    return _ELEMENT_BYTES.get((dtype or "").lower(), 4)


def _mnk(name: str, shapes: list[list[int] | None]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM op from its input shapes, None when they do not fit."""
    dims = [s for s in shapes if s is not None]
    try:
        if name == "aten::linear" and len(dims) >= 2 and len(dims[0]) >= 1 and len(dims[1]) == 2:
            x, w = dims[0], dims[1]
            return 1, prod(x[:-1]) or 1, w[0], w[1]
        if name == "aten::mm" and len(dims) >= 2:
            return 1, dims[0][0], dims[1][1], dims[0][1]
        if name == "aten::addmm" and len(dims) >= 3:
            return 1, dims[1][0], dims[2][1], dims[1][1]
        if name in ("aten::bmm", "aten::matmul") and len(dims) >= 2 and len(dims[0]) >= 2 and len(dims[1]) >= 2:
            a, b = dims[0], dims[1]
            return prod(a[:-2]) or 1, a[-2], b[-1], a[-1]
    except (IndexError, TypeError):
        return None
    return None


def gemm_flops_and_bytes(op: OperatorRecord) -> tuple[float, float] | None:
    """(FLOPs, minimum DRAM bytes) of a GEMM operator call from its shapes, None when unknown."""
    if not op.input_shapes:
        return None
    found = _mnk(op.operator_name, op.input_shapes)
    if found is None:
        return None
    batch, m, n, k = found
    size = element_bytes((op.input_dtypes or [None])[0])
    flops = 2.0 * batch * m * n * k
    operands = [s for s in op.input_shapes if s is not None]
    moved = float(size * (sum(prod(s) for s in operands[:3] if s) + batch * m * n))
    return (flops, moved) if flops > 0 else None


CONVOLUTIONS = ("aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::_convolution",
                "aten::cudnn_convolution")


def minimum_bytes(op: OperatorRecord) -> float | None:
    """The DRAM bytes a GEMM or convolution call must move at least, from its shapes: a GEMM's operands and result,
    a convolution's input and weight (its output's size needs the stride and padding); None for other operators."""
    if op.operator_name in CONVOLUTIONS and op.input_shapes and len(op.input_shapes) >= 2:
        x, w = op.input_shapes[0], op.input_shapes[1]
        if x and w:
            return float(element_bytes((op.input_dtypes or [None])[0]) * (prod(x) + prod(w)))
        return None
    found = gemm_flops_and_bytes(op)
    return found[1] if found else None
