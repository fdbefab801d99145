"""A PointNet classifier (written here, random weights): an input transform network that predicts a 3x3 matrix per
cloud and applies it with `bmm`, shared per-point MLPs as 1x1 `Conv1d` + BatchNorm + ReLU (3 -> 64 -> 128 -> 1024),
a max over the points, and a 1024 -> 512 -> 256 -> 40 head; 32 clouds of 2,048 points, eval mode, under the workload
contract. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (4 clouds of 128 points, a quarter of the widths)."""

from __future__ import annotations

import os

import torch
from torch import nn


def point_mlp(widths: list[int]) -> nn.Sequential:
    """A per-point MLP: 1x1 convolutions over the points, each with BatchNorm and ReLU."""
    layers: list[nn.Module] = []
    for width_in, width_out in zip(widths, widths[1:], strict=False):
        layers += [nn.Conv1d(width_in, width_out, 1), nn.BatchNorm1d(width_out), nn.ReLU()]
    return nn.Sequential(*layers)


def head(widths: list[int], out: int) -> nn.Sequential:
    """A cloud-level MLP: Linear + BatchNorm + ReLU, then a final Linear."""
    layers: list[nn.Module] = []
    for width_in, width_out in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(width_in, width_out), nn.BatchNorm1d(width_out), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], out))


class InputTransform(nn.Module):
    """T-Net: a 3x3 matrix per cloud, the identity plus what a small PointNet predicts."""

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.points = point_mlp([3, 64 // scale, 128 // scale, 1024 // scale])
        self.matrix = head([1024 // scale, 512 // scale, 256 // scale], 9)

    def forward(self, cloud: torch.Tensor) -> torch.Tensor:
        pooled = self.points(cloud).amax(dim=2)
        return self.matrix(pooled).view(-1, 3, 3) + torch.eye(3, device=cloud.device)


class PointNet(nn.Module):
    """Point clouds (batch, 3, points) -> class logits (batch, classes)."""

    def __init__(self, classes: int, scale: int) -> None:
        super().__init__()
        self.transform = InputTransform(scale)
        self.points = point_mlp([3, 64 // scale, 128 // scale, 1024 // scale])
        self.classifier = head([1024 // scale, 512 // scale, 256 // scale], classes)

    def forward(self, cloud: torch.Tensor) -> torch.Tensor:
        aligned = torch.bmm(self.transform(cloud), cloud)
        return self.classifier(self.points(aligned).amax(dim=2))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The classifier in eval mode and a batch of point clouds, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    scale, batch, points = (4, 4, 128) if small else (1, 32, 2048)
    torch.manual_seed(0)
    model = PointNet(40, scale).to(device).eval()
    return model, (torch.randn(batch, 3, points, device=device),)
