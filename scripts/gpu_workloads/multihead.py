"""A multi-task vision model: a small conv trunk shared by three heads, its forward returning a dict (class logits,
a box regression, a per-pixel mask) and taking an image and an integer task id per sample."""

from __future__ import annotations

import torch
from torch import nn


class MultiHead(nn.Module):
    """A trunk, a task embedding added to its pooled features, and three heads in a dict."""

    def __init__(self, width: int = 64, tasks: int = 4) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        )
        self.task = nn.Embedding(tasks, 2 * width)
        self.classes = nn.Linear(2 * width, 100)
        self.boxes = nn.Sequential(nn.Linear(2 * width, 256), nn.ReLU(), nn.Linear(256, 4))
        self.mask = nn.Conv2d(2 * width, 1, 1)

    def forward(self, image: torch.Tensor, task: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.trunk(image)
        pooled = features.mean(dim=(2, 3)) + self.task(task)
        return {"classes": self.classes(pooled), "boxes": self.boxes(pooled).sigmoid(),
                "mask": self.mask(features)}


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval), 32 images of 3x160x160 and their task ids on a GPU (4 of 3x32x32 on a CPU)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch, side = (32, 160) if device.type == "cuda" else (4, 32)
    model = MultiHead().to(device).eval()
    return model, (torch.randn(batch, 3, side, side, device=device), torch.randint(0, 4, (batch,), device=device))
