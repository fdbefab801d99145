"""The tiny MLP as a user who loads a model in bfloat16 writes it: parameters and input in bfloat16, so the
reference (eager as written) computes in bfloat16, not fp32."""

from __future__ import annotations

import torch
from tiny_mlp import get_model_and_input as fp32_model_and_input
from torch import nn


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """tiny_mlp's model and input, cast to bfloat16."""
    model, (x,) = fp32_model_and_input()
    return model.to(torch.bfloat16), (x.to(torch.bfloat16),)
