"""Run the model's float32 GEMMs and convolutions on TF32 tensor cores, scoped to its calls (IR level: module).

`with_tf32(fn)` wraps a callable (usually the compiled model) so that `torch.backends.cuda.matmul.allow_tf32`
and `torch.backends.cudnn.allow_tf32` are on while it runs, and restored to what they were when it returns
(or raises): the process-wide settings, and so every other model in the process, are left as they were. Under
CUDA graphs the kernels chosen while TF32 is on are the ones recorded and replayed.

When to apply: the reduced precision tier, when float32 GEMMs run on CUDA cores (FFMA) and dominate, and BF16
(`bf16_weights.py`) is not accurate enough for the user's tolerance: TF32 keeps float32 storage and rounds
only the multiplications' inputs to a 10-bit mantissa (BF16: 7 bits), about 8x less error per rounding.

Trigger metrics (analysis.json): an `fp32_matmul` finding or an opportunity "Run N FP32 GEMMs on tensor
cores"; `tensor_pipe_active_pct` 0 with `inst_ffma` high in the GEMM kernels; a BF16 attempt whose validation
fails the reduced tier's 1e-2.

Expected gain: the GEMMs' tensor-core speedup (TF32 peak is half BF16's on H100) without halving weight bytes.
Measured on the H100 (mlp_activations: 9 GEMMs 512x2048x2048): see examples/mlp_activations/report.md.
Precision changes: validate in the reduced tier and report the error distribution. Self-contained (torch only):
copy it into an optimized workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def with_tf32(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with TF32 on for cuBLAS and cuDNN during each call; the previous settings restored afterwards."""

    def run(*args: Any, **kwargs: Any) -> Any:
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            return fn(*args, **kwargs)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn

    return run
