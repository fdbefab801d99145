"""A candidate beyond sdpa_attention's reduced-tier winner (eager+fp16-cast), benched against it and kept as the
record of the attempt: the winner's whole-model float16 cast run eagerly, the whole call replayed from one CUDA graph
(knowledge/fx_patterns/whole_forward_graph.py, imported from the repository), no compiler.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "examples" / "sdpa_attention"), str(REPO / "knowledge" / "fx_patterns")]
from sdpa_attention import get_model_and_input  # noqa: E402,F401 - same model and inputs as the baseline
from whole_forward_graph import graph_whole_forward  # noqa: E402 - the pattern's own code

RECIPE = "eager+fp16-cast"
APPLIED_PASSES: dict[str, int] = {}


def _count(name: str) -> None:
    APPLIED_PASSES[name] = APPLIED_PASSES.get(name, 0) + 1


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16, each call replayed from one CUDA graph per input signature."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    _count("fp16_weights")
    return graph_whole_forward(model, on_capture=lambda: _count("whole_forward_graph"))


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in float16, converted once before the calls."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
