"""t5_encoder, optimized beyond the reduced tier's winner of the free frontier (a workload outside examples/).

Its winner on the H200 was `reduce-overhead+fp16-cast` (`optimize --tier reduced`, 2026-11-29): those lines as plain
code, the whole call replayed from one CUDA graph (winner_graph.py), and the hand-written attention, whose softmax
Inductor had fused with the relative-position bias's arithmetic in each layer, rewritten as
`scaled_dot_product_attention` with the bias as its additive mask (knowledge/fx_patterns/sdpa_substitution.py), as
the analysis of the winner's profile proposed (its first opportunity).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from t5_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, count_pass, winner_functions, winner_graph_backend  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from sdpa_substitution import substitute_sdpa_through_casts  # noqa: E402 - the pattern's own code

BACKEND_NAME = "t5_sdpa_winner_graph"


def with_sdpa(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.fx.GraphModule:
    """`gm` with each layer's attention as one scaled_dot_product_attention call, each rewrite counted."""
    for _ in range(substitute_sdpa_through_casts(gm, example_inputs)):
        count_pass("sdpa_substitution")
    return gm


@torch._dynamo.register_backend(name=BACKEND_NAME)
def sdpa_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Each layer's attention as one scaled_dot_product_attention call, then the winner's Inductor compile."""
    return winner_graph_backend(with_sdpa(gm, example_inputs), example_inputs)


optimize, prepare_inputs = winner_functions(channels_last=False, cudnn_benchmark=False, backend=BACKEND_NAME)
