"""text_classifier with its reduced tier's winner on the H200 applied as `operator-profiler optimize` writes it
(`reduce-overhead+fp16-autocast`: `torch.compile(mode="reduce-overhead")`, CUDA-graph trees, under float16
autocast), for `run --compile-mode optimized`: what the recipe leaves is its call's host work around the graphs."""

from __future__ import annotations

from typing import Any

import torch
from text_classifier import get_model_and_input  # noqa: F401 - the baseline's model and inputs
from torch.utils._pytree import tree_map

RECIPE = "reduce-overhead+fp16-autocast"


def optimize(model: torch.nn.Module) -> Any:
    """reduce-overhead+fp16-autocast applied to `model`: a callable taking the baseline's inputs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    compiled = torch.compile(model, mode="reduce-overhead")

    def run(*inputs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast("cuda", dtype=torch.float16):
            out = compiled(*inputs)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)  # replays overwrite outputs

    return run
