"""decode_greedy_static in the reduced tier: the reduced tier's winner's cast (the whole model in bfloat16) with the
static KV cache and each step replayed from a CUDA graph, measured against that winner (`reduce-overhead+bf16-cast`)
by `benchmarks/beyond_check.py --tier reduced`. The output is the tokens: bfloat16 must emit the fp32 ones."""

from __future__ import annotations

import torch
from decode_greedy_static import APPLIED_PASSES, BACKEND_NAME, StaticGreedy, get_model_and_input  # noqa: F401


def optimize(model: torch.nn.Module) -> StaticGreedy:
    """The generator in bfloat16 over a static KV cache, its steps compiled and graphed on a GPU."""
    model = model.to(torch.bfloat16)
    APPLIED_PASSES["bf16_weights"] = 1
    return StaticGreedy(model, compiled=next(model.parameters()).is_cuda)  # type: ignore[arg-type]
