"""A video classifier (the workload contract): a small 3-D CNN over clips of 8 frames of 112x112 (batch 8), a
C3D-style stem (3x3x3 convolution, BatchNorm3d, ReLU, a spatial-only 1x2x2 max pool), three stages of two 3x3x3
convolutions each (the first of each stage strided in time and space), global average pooling over time and space
(AdaptiveAvgPool3d) and a linear head over 400 classes. Random weights, inference.

    operator-profiler run scripts/gpu_workloads/video_classifier.py
    operator-profiler recipes scripts/gpu_workloads/video_classifier.py

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import os

import torch
from torch import nn

SIZES = {"gpu": {"batch": 8, "frames": 8, "side": 112, "widths": (64, 128, 256, 512), "classes": 400},
         "small": {"batch": 2, "frames": 4, "side": 32, "widths": (8, 16, 16, 32), "classes": 10}}


def conv_bn_relu(cin: int, cout: int, stride: tuple[int, int, int] = (1, 1, 1)) -> nn.Sequential:
    """A 3x3x3 convolution, BatchNorm3d and ReLU."""
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm3d(cout),
                         nn.ReLU(inplace=True))


class VideoNet(nn.Module):
    """Clips (batch, 3, frames, H, W) -> class logits (batch, classes)."""

    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn_relu(3, widths[0]), nn.MaxPool3d((1, 2, 2), (1, 2, 2)))
        self.stages = nn.Sequential(*[nn.Sequential(conv_bn_relu(a, b, (2, 2, 2)), conv_bn_relu(b, b))
                                      for a, b in zip(widths, widths[1:], strict=False)])
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.stages(self.stem(clips))).flatten(1))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model in eval mode and one batch of clips, on CUDA when available."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = VideoNet(sizes["widths"], sizes["classes"]).to(device).eval()
    clips = torch.randn(sizes["batch"], 3, sizes["frames"], sizes["side"], sizes["side"], device=device)
    return model, (clips,)
