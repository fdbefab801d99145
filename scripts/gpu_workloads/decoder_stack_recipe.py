"""decoder_stack with its free-frontier winner applied as `operator-profiler optimize` writes it (reduce-overhead +
bf16-cast, measured on the H200: `h200_fp8_decoder.json`): a workload whose own `optimize()` runs the model from
CUDA-graph trees, the most common winner's shape, for `run --compile-mode optimized`."""

from __future__ import annotations

from typing import Any

import torch
from decoder_stack import get_model_and_input  # noqa: F401 - the baseline's model and inputs
from torch.utils._pytree import tree_map

RECIPE = "reduce-overhead+bf16-cast"


def optimize(model: torch.nn.Module) -> Any:
    """reduce-overhead+bf16-cast applied to `model`: a callable taking inputs converted once by prepare_inputs."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.bfloat16)
    compiled = torch.compile(model, mode="reduce-overhead")

    def run(*inputs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*inputs)
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)  # replays overwrite outputs

    return run


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in bfloat16, converted once before the calls."""
    return tuple((x.to(torch.bfloat16) if x.is_floating_point() else x) if isinstance(x, torch.Tensor) else x
                 for x in inputs)
