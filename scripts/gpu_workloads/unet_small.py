"""A small U-Net (two down and two up stages of conv-batchnorm-SiLU, skip connections, a transposed-conv upsample)
on 16 images of 3x128x128 in eval mode (`small`: 2 images of 32x32, half the width): a CNN none of the examples is."""

from __future__ import annotations

import os

import torch
from torch import nn


def stage(c_in: int, c_out: int) -> nn.Sequential:
    """Two 3x3 conv-batchnorm-SiLU layers."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.SiLU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.SiLU(),
    )


class UNet(nn.Module):
    """Encoder stages, a bottleneck, decoder stages fed by the encoder's skips, and a 1x1 head."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.down1, self.down2 = stage(3, width), stage(width, 2 * width)
        self.pool = nn.MaxPool2d(2)
        self.bottom = stage(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = stage(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = stage(2 * width, width)
        self.head = nn.Conv2d(width, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(self.pool(s1))
        y = self.bottom(self.pool(s2))
        y = self.dec2(torch.cat([self.up2(y), s2], dim=1))
        y = self.dec1(torch.cat([self.up1(y), s1], dim=1))
        return self.head(y)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and its input batch, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, side, width = (2, 32, 16) if small else (16, 128, 32)
    model = UNet(width).eval().to(device)
    return model, (torch.randn(batch, 3, side, side, device=device),)
