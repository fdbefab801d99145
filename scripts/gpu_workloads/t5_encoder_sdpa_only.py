"""t5_encoder with its winner's lines (reduce-overhead's CUDA graph trees kept) and the attention rewritten as
`scaled_dot_product_attention` with the bias as its additive mask: t5_encoder_optimized.py without its whole-call
graph, to tell the two changes' effects apart."""

from __future__ import annotations

from typing import Any

import torch
from t5_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from t5_encoder_optimized import with_sdpa
from winner_graph import APPLIED_PASSES, graph_trees_functions  # noqa: F401

BACKEND_NAME = "t5_sdpa_graph_trees"


@torch._dynamo.register_backend(name=BACKEND_NAME)
def sdpa_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Each layer's attention as one scaled_dot_product_attention call, then Inductor with CUDA graph trees."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(with_sdpa(gm, example_inputs), example_inputs,
                      config_patches={"triton.cudagraphs": torch.cuda.is_available()})


optimize, prepare_inputs = graph_trees_functions(cudnn_benchmark=False, backend=BACKEND_NAME)
