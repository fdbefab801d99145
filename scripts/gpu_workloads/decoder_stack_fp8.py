"""decoder_stack in the fp8 tier: the reduced tier's winner (the whole model in bfloat16, compiled with
`mode="reduce-overhead"`) with every linear layer an FP8 GEMM (knowledge/fx_patterns/fp8_linear.py, imported from
the repository, not copied), measured against that winner by `benchmarks/beyond_check.py --tier fp8`."""

from __future__ import annotations

import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from cuda_graphs import clone_outputs  # noqa: E402 - the patterns' own code
from decoder_stack import get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from fp8_linear import to_fp8_linear  # noqa: E402

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module, paths: Collection[str] | None = None) -> Any:
    """The model in bfloat16, its linear layers (those at `paths` when given) FP8 GEMMs, compiled with reduce-overhead
    on a GPU (eager on the CPU, where `_scaled_mm` is a reference implementation Inductor does not lower); each call's
    output its own (a replay overwrites the graph's output memory: `clone_outputs`)."""
    model = model.to(torch.bfloat16)
    APPLIED_PASSES["bf16_weights"] = 1
    APPLIED_PASSES["fp8_linear"] = len(to_fp8_linear(model, paths=paths))
    if not next(model.buffers()).is_cuda:
        return model
    APPLIED_PASSES["inductor"] = 1
    return clone_outputs(torch.compile(model, mode="reduce-overhead"))


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in bfloat16, converted once."""
    return tuple(x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
