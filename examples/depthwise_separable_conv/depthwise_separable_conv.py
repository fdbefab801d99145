"""MobileNet-style depthwise-separable convolution stack.

Architecture: a ``stem`` (3x3 Conv2d + BatchNorm2d + ReLU6), then ``blocks.<i>``, each a depthwise 3x3
convolution (``groups`` = channels) + BatchNorm2d + ReLU6 followed by a pointwise 1x1 convolution +
BatchNorm2d + ReLU6; some blocks use stride 2 in the depthwise conv. Global average pooling and a
``classifier`` Linear finish the network.

Default ("full") shapes: input ``(32, 32, 112, 112)`` float32 (batch, channels, height, width), block
output channels 64/128/128/256/256, 1000 classes; output ``(32, 1000)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (input ``(2, 8, 32, 32)``, block channels 16/32/32/64/64, 10 classes). The default is ``full``.
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
        "in_channels": 32,
        "image_size": 112,
        # (out_channels, depthwise stride) per depthwise-separable block
        "blocks": ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1)),
        "num_classes": 1000,
    },
    "small": {
        "batch": 2,
        "in_channels": 8,
        "image_size": 32,
        "blocks": ((16, 1), (32, 2), (32, 1), (64, 2), (64, 1)),
        "num_classes": 10,
    },
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class ConvBNReLU6(nn.Module):
    """Conv2d (no bias) + BatchNorm2d + ReLU6."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size=kernel_size,
            stride=stride,
            padding=kernel_size // 2,
            groups=groups,
            bias=False,
        )
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU6(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class DepthwiseSeparableBlock(nn.Module):
    """Depthwise 3x3 conv (groups = in_channels) followed by a pointwise 1x1 conv, each with BN + ReLU6."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.depthwise = ConvBNReLU6(
            in_channels, in_channels, kernel_size=3, stride=stride, groups=in_channels
        )
        self.pointwise = ConvBNReLU6(in_channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class DepthwiseSeparableNet(nn.Module):
    """Stem conv, a sequence of depthwise-separable blocks, global pooling and a Linear classifier."""

    def __init__(self, in_channels: int, blocks: tuple[tuple[int, int], ...], num_classes: int) -> None:
        super().__init__()
        self.stem = ConvBNReLU6(in_channels, in_channels, kernel_size=3)
        layers: list[nn.Module] = []
        channels = in_channels
        for out_channels, stride in blocks:
            layers.append(DepthwiseSeparableBlock(channels, out_channels, stride))
            channels = out_channels
        self.blocks = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        x = self.pool(x).flatten(1)
        return self.classifier(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DepthwiseSeparableNet(
        in_channels=sizes["in_channels"], blocks=sizes["blocks"], num_classes=sizes["num_classes"]
    )
    model = model.to(device).eval()
    x = torch.randn(
        sizes["batch"], sizes["in_channels"], sizes["image_size"], sizes["image_size"], device=device
    )
    return model, (x,)
