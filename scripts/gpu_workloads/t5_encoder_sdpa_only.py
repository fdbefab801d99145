"""t5_encoder with its winner's lines (reduce-overhead's CUDA graph trees kept) and the attention rewritten as
`scaled_dot_product_attention` with the bias as its additive mask: t5_encoder_optimized.py without its whole-call
graph, to tell the two changes' effects apart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from t5_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch.utils._pytree import tree_map
from winner_graph import APPLIED_PASSES, count_pass  # noqa: F401

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


def optimize(model: torch.nn.Module) -> Any:
    """float16 weights, the SDPA rewrite, Inductor with graph trees; each call's outputs copied."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    compiled = torch.compile(model.to(torch.float16), backend=BACKEND_NAME)

    def run(*args: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, compiled(*args))

    return run


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in float16 (token ids stay integers), converted once."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
