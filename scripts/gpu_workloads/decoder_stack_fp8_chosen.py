"""decoder_stack in the fp8 tier with FP8 GEMMs on the linears `fp8_linear.fp8_layer_choice` keeps within the tier:
16 of the 28 (every layer's error alone, least harmful first, while the whole model's worst output error stays within
0.8 x 0.25), chosen on the CPU's reference `_scaled_mm` for the seed-0 weights and 512 tokens, where the whole model's
worst error came to 0.198 (all 28 layers: 0.46, and 0.45-0.48 measured on an H200). Not yet measured on a GPU. The rest
as decoder_stack_fp8.py: the fp8 tier's winner (bf16, reduce-overhead) around them."""

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
FP8_PATHS = (  # fp8_layer_choice's order: the least harmful first
    "blocks.2.attn.q", "blocks.2.attn.k", "blocks.3.attn.o", "blocks.3.attn.q", "blocks.3.attn.k", "blocks.3.attn.v",
    "blocks.2.attn.o", "blocks.1.attn.q", "blocks.1.attn.k", "blocks.2.attn.v", "blocks.3.mlp.gate", "blocks.0.attn.k",
    "blocks.3.mlp.up", "blocks.3.mlp.down", "blocks.2.mlp.down", "blocks.2.mlp.up",
)


def optimize(model: torch.nn.Module) -> Any:
    """The model in bfloat16, the chosen linears FP8 GEMMs, compiled with reduce-overhead on a GPU (eager on the CPU);
    each call's output its own (a replay overwrites the graph's output memory)."""
    model = model.to(torch.bfloat16)
    APPLIED_PASSES["bf16_weights"] = 1
    APPLIED_PASSES["fp8_linear"] = len(to_fp8_linear(model, paths=FP8_PATHS))
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
