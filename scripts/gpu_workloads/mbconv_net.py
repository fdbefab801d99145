"""An EfficientNet-B0-shaped image classifier (the workload contract), written here: a strided stem, seven stages of
MBConv blocks (1x1 expansion, a depthwise 3x3 or 5x5 convolution, squeeze-and-excitation, 1x1 projection,
BatchNorm and SiLU, a residual where the shape allows), a 1x1 head, global pooling and a linear classifier. Random
weights, 32 images of 224x224, eval mode. `mbconv_train.py` trains the same network as a plain script.
"""

from __future__ import annotations

import os

import torch
from torch import nn

SIZES = {"full": {"batch": 32, "side": 224, "width": 1.0}, "small": {"batch": 2, "side": 32, "width": 0.25}}
# (expansion, channels, blocks, stride, kernel) per stage, EfficientNet-B0's
STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
          (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    """A convolution without bias, BatchNorm, and SiLU unless `act` is False."""
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.SiLU()) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel weights from the globally pooled features (two 1x1 convolutions, SiLU then a sigmoid)."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.expand(nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * weights.sigmoid()


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expansion: int, stride: int, kernel: int) -> None:
        super().__init__()
        hidden = cin * expansion
        self.expand = conv_bn(cin, hidden, 1) if expansion != 1 else nn.Identity()
        self.depthwise = conv_bn(hidden, hidden, kernel, stride, groups=hidden)
        self.se = SqueezeExcite(hidden, max(1, cin // 4))
        self.project = conv_bn(hidden, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class MBConvNet(nn.Module):
    def __init__(self, width: float = 1.0, classes: int = 1000) -> None:
        super().__init__()

        def scaled(channels: int) -> int:
            return max(8, int(channels * width) // 8 * 8)

        cin = scaled(32)
        blocks: list[nn.Module] = [conv_bn(3, cin, 3, 2)]
        for expansion, channels, count, stride, kernel in STAGES:
            for i in range(count):
                blocks.append(MBConv(cin, scaled(channels), expansion, stride if i == 0 else 1, kernel))
                cin = scaled(channels)
        blocks.append(conv_bn(cin, scaled(1280), 1))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(scaled(1280), classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).mean((2, 3)))


def scale() -> dict[str, float]:
    """The sizes OPERATOR_PROFILER_EXAMPLE_SCALE names (full unless set)."""
    name = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")
    if name not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be one of {sorted(SIZES)}, not {name!r}")
    return SIZES[name]


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = scale()
    model = MBConvNet(sizes["width"]).to(device).eval()
    side = int(sizes["side"])
    return model, (torch.randn(int(sizes["batch"]), 3, side, side, device=device),)
