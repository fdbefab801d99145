"""torchvision's ResNet-50 with random weights on a batch of 32 images of 224x224 (`small`: ResNet-18, 2 of 64x64)."""

from __future__ import annotations

import os

import torch
import torchvision


def get_model_and_input() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and its input batch, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = (torchvision.models.resnet18() if small else torchvision.models.resnet50()).eval().to(device)
    batch, side = (2, 64) if small else (32, 224)
    return model, (torch.randn(batch, 3, side, side, device=device),)
