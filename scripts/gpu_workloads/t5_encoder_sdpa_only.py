"""t5_encoder with its winner's lines (reduce-overhead's CUDA graph trees kept) and the attention rewritten as
`scaled_dot_product_attention` with the bias as its additive mask: t5_encoder_optimized.py without its whole-call
graph, to tell the two changes' effects apart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from t5_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from winner_graph import APPLIED_PASSES, count_pass, graph_trees_functions  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from sdpa_substitution import substitute_sdpa_through_casts  # noqa: E402 - the pattern's own code

BACKEND_NAME = "t5_sdpa_graph_trees"


@torch._dynamo.register_backend(name=BACKEND_NAME)
def sdpa_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Each layer's attention as one scaled_dot_product_attention call, then Inductor with CUDA graph trees."""
    from torch._inductor.compile_fx import compile_fx

    for _ in range(substitute_sdpa_through_casts(gm, example_inputs)):
        count_pass("sdpa_substitution")
    return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": torch.cuda.is_available()})


optimize, prepare_inputs = graph_trees_functions(cudnn_benchmark=False, backend=BACKEND_NAME)
