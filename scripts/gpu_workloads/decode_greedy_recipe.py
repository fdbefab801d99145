"""decode_greedy with its exact tier's winner applied as `operator-profiler optimize` writes it
(`torch.compile(mode="reduce-overhead")` in float32, measured on the H200: `h200_decode_static.json`): the floor whose
profile (`run --compile-mode optimized`: CUDA-graph trees, one per KV length) the loop reads for what is left."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from cuda_graphs import clone_outputs  # noqa: E402 - the patterns' own code
from decode_greedy import get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline

BACKEND_NAME = "inductor"
APPLIED_PASSES: dict[str, int] = {}


def optimize(model: torch.nn.Module) -> Any:
    """The generator compiled with reduce-overhead (CUDA-graph trees on a GPU); each call's output its own."""
    APPLIED_PASSES["inductor"] = 1
    return clone_outputs(torch.compile(model, mode="reduce-overhead"))
