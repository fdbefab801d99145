"""The bfloat16 tiny MLP behind a check that refuses any other dtype, as a kernel written for half precision only
(a fused attention extension, say) does: the model cannot be run in float32 to measure its own precision."""

from __future__ import annotations

import torch
from tiny_mlp_bf16 import get_model_and_input as bf16_model_and_input
from torch import nn


class HalfOnly(nn.Module):
    """The wrapped model, for bfloat16 inputs only."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"this kernel takes bfloat16 only, not {x.dtype}")
        return self.inner(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """tiny_mlp_bf16's model behind the dtype check, and its input."""
    model, inputs = bf16_model_and_input()
    return HalfOnly(model), inputs
