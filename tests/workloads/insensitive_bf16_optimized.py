"""insensitive.py with the free recipe `eager+bf16-cast`: its bfloat16 outputs are the same for any input, and
within the reduced tier's tolerance of each float32 output."""

from __future__ import annotations

from typing import Any

import torch
from insensitive import get_model_and_input  # noqa: F401 - same model and inputs

RECIPE = "eager+bf16-cast"


def optimize(model: torch.nn.Module) -> Any:
    """The model cast to bfloat16, its inputs cast on the way in."""
    model = model.to(torch.bfloat16)
    return lambda x: model(x.to(torch.bfloat16))
