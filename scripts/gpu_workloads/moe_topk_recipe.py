"""moe_topk with the exact tier's winner applied as `operator-profiler optimize` writes it (`torch.compile(
mode="reduce-overhead")` in float32), nothing else: the floor whose profile (`run --compile-mode optimized`) the loop
reads for what is left, the routers' split chains among it."""

from __future__ import annotations

from typing import Any

import torch
from moe_topk_triton import APPLIED_PASSES, BACKEND_NAME, get_model_and_input  # noqa: F401
from moe_topk_triton import optimize as optimize_in


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with reduce-overhead on a GPU, its routers as written."""
    return optimize_in(model, fuse=False)
