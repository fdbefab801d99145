"""sdpa_attention, optimized: the reduced tier's winner of the free frontier is the answer
(evidence: examples/sdpa_attention/recipes.json and analysis.json, NVIDIA H100 80GB HBM3).

The winner, `eager+fp16-cast` (recipes.json: 223.8 µs per call alone, 222.0 µs back to back; largest relative error
against fp32 eager 0.0015): the whole model cast to float16, run eagerly, its input converted once by
`prepare_inputs`; recorded as `fp16_weights`. Nothing is added: the call is GPU-bound (alone and queued differ by
1.8 µs, so a CUDA graph has no host time to win back), and its kernels are cuBLAS's FP16 GEMMs at 74 % of the
tensor pipe and cuDNN's flash attention (wgmma) at 46 % (the winner's own profile, analysis_optimized/). Two changes
were tried beyond it and benched against it: q, k and v fused into one GEMM with the whole call replayed from one CUDA
graph (benchmarks/candidates/sdpa_attention_qkv_graph.py), and the eager call replayed from one CUDA graph
(benchmarks/candidates/sdpa_attention_graph.py); both lost back to back, the graph's input and output copies
costing more than the launches they save (optimizations.json).
"""

from __future__ import annotations

from typing import Any

import torch
from sdpa_attention import get_model_and_input  # noqa: F401 - same model and inputs as the baseline

RECIPE = "eager+fp16-cast"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16, run eagerly (taking inputs converted by `prepare_inputs`)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return model


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs as the optimized call takes them, converted once before the calls."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
