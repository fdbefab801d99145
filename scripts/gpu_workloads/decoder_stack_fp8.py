"""decoder_stack in the fp8 tier: the reduced tier's winner (the whole model in bfloat16, compiled with
`mode="reduce-overhead"`) with every linear layer an FP8 GEMM (knowledge/fx_patterns/fp8_linear.py, imported from
the repository, not copied), measured against that winner by `benchmarks/beyond_check.py --tier fp8`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from decoder_stack import get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from fp8_linear import to_fp8_linear  # noqa: E402 - the pattern's own code

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module) -> Any:
    """The model in bfloat16, its linear layers FP8 GEMMs, compiled with reduce-overhead on a GPU (eager on the CPU,
    where `_scaled_mm` is a reference implementation Inductor does not lower); each call's output is its own, as in
    the recipes' workloads (a replay overwrites the graph's output memory)."""
    model = model.to(torch.bfloat16)
    APPLIED_PASSES["bf16_weights"] = 1
    APPLIED_PASSES["fp8_linear"] = len(to_fp8_linear(model))
    if not next(model.buffers()).is_cuda:
        return model
    compiled = torch.compile(model, mode="reduce-overhead")
    APPLIED_PASSES["inductor"] = 1

    def run(*inputs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs).clone()

    return run


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in bfloat16, converted once."""
    return tuple(x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
