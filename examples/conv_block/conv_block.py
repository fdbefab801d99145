"""VGG-style convolutional stack: Conv2d + BatchNorm2d + ReLU blocks with MaxPool between stages.

Architecture: 3 stages of 2 conv blocks each (3x3 convolutions, padding 1), a MaxPool2d(2) after every
stage, then global average pooling and a Linear classifier.

Default ("full") shapes: channels 64/128/256, input ``(32, 3, 224, 224)`` float32, output ``(32, 1000)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (channels 8/16/32, input ``(2, 3, 32, 32)``, 10 classes). The default is ``full``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "batch": 32,
        "in_channels": 3,
        "image_size": 224,
        "stage_channels": (64, 128, 256),
        "blocks_per_stage": 2,
        "num_classes": 1000,
    },
    "small": {
        "batch": 2,
        "in_channels": 3,
        "image_size": 32,
        "stage_channels": (8, 16, 32),
        "blocks_per_stage": 2,
        "num_classes": 10,
    },
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class ConvBNReLU(nn.Module):
    """3x3 Conv2d (no bias) followed by BatchNorm2d and ReLU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class ConvNet(nn.Module):
    """VGG-style network: ``features`` (conv blocks and pools), global pooling, ``classifier``."""

    def __init__(
        self,
        in_channels: int,
        stage_channels: tuple[int, ...],
        blocks_per_stage: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for out_channels in stage_channels:
            for _ in range(blocks_per_stage):
                layers.append(ConvBNReLU(channels, out_channels))
                channels = out_channels
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.pool(x).flatten(1)
        return self.classifier(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ConvNet(
        in_channels=sizes["in_channels"],
        stage_channels=sizes["stage_channels"],
        blocks_per_stage=sizes["blocks_per_stage"],
        num_classes=sizes["num_classes"],
    )
    model = model.to(device).eval()
    x = torch.randn(
        sizes["batch"], sizes["in_channels"], sizes["image_size"], sizes["image_size"], device=device
    )
    return model, (x,)


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One forward + backward pass with a simple scalar loss (no optimizer step)."""
    out = model(*inputs)
    loss = out.float().pow(2).mean()
    loss.backward()
    return loss
