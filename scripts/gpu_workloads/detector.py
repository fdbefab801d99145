"""A one-stage detector's inference: a small conv backbone, a score and box head over a 32x32 grid, then boxes kept
by a score threshold (a boolean mask: data-dependent shapes), the 100 best of them refined by an MLP (batch 4)."""

from __future__ import annotations

import torch
from torch import nn


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.Conv2d(128, 128, 3, 2, 1), nn.BatchNorm2d(128), nn.ReLU())
        self.scores = nn.Conv2d(128, 1, 1)
        self.boxes = nn.Conv2d(128, 4, 1)
        self.refine = nn.Sequential(nn.Linear(128 + 4, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.backbone(images)
        scores = self.scores(features).sigmoid().flatten(1)
        boxes = self.boxes(features).flatten(2).transpose(1, 2)
        feats = features.flatten(2).transpose(1, 2)
        out = []
        for i in range(images.shape[0]):
            keep = scores[i] > 0.3
            kept_scores, kept_boxes, kept_feats = scores[i][keep], boxes[i][keep], feats[i][keep]
            top = kept_scores.topk(min(100, kept_scores.numel())).indices
            refined = kept_boxes[top] + self.refine(torch.cat([kept_feats[top], kept_boxes[top]], -1))
            out.append(torch.nn.functional.pad(refined, (0, 0, 0, 100 - refined.shape[0])))
        return torch.stack(out)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Detector().to(device).eval(), (torch.randn(4, 3, 512, 512, device=device),)
