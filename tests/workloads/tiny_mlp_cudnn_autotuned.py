"""The tiny MLP with cuDNN's autotuner turned on while it builds: a warm-up that times algorithms."""

from __future__ import annotations

import tiny_mlp
import torch


def get_model_and_input() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The tiny MLP and its input, with torch.backends.cudnn.benchmark on."""
    torch.backends.cudnn.benchmark = True
    return tiny_mlp.get_model_and_input()
