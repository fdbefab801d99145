"""decoder_stack in the fp8 tier with FP8 GEMMs on the linears `fp8_linear.fp8_layer_choice` keeps within the tier:
16 of the 28 (every layer's error alone, least harmful first, while the whole model's worst output error stays within
0.8 x 0.25), chosen on the CPU's reference `_scaled_mm` for the seed-0 weights and 512 tokens, where the whole model's
worst error came to 0.198 (all 28 layers: 0.46, and 0.45-0.48 measured on an H200). Not yet measured on a GPU. The rest
as decoder_stack_fp8.py: the fp8 tier's winner (bf16, reduce-overhead) around them."""

from __future__ import annotations

from typing import Any

import torch
from decoder_stack_fp8 import APPLIED_PASSES, BACKEND_NAME, get_model_and_input, prepare_inputs  # noqa: F401
from decoder_stack_fp8 import optimize as fp8_everywhere

FP8_PATHS = (  # fp8_layer_choice's order: the least harmful first
    "blocks.2.attn.q", "blocks.2.attn.k", "blocks.3.attn.o", "blocks.3.attn.q", "blocks.3.attn.k", "blocks.3.attn.v",
    "blocks.2.attn.o", "blocks.1.attn.q", "blocks.1.attn.k", "blocks.2.attn.v", "blocks.3.mlp.gate", "blocks.0.attn.k",
    "blocks.3.mlp.up", "blocks.3.mlp.down", "blocks.2.mlp.down", "blocks.2.mlp.up",
)


def optimize(model: torch.nn.Module) -> Any:
    """decoder_stack_fp8's optimize on the chosen linears only."""
    return fp8_everywhere(model, paths=FP8_PATHS)
