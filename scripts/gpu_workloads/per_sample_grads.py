"""Differentially private training (DP-SGD) of a small CNN classifier, written with `torch.func`: every example's
own gradient by `vmap(grad(loss))` over `functional_call`, each clipped to norm 1, summed, noised and applied by SGD.
The workload contract with a `train_step`: `operator-profiler run scripts/gpu_workloads/per_sample_grads.py
--train-step`. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

SMALL = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
BATCH, SIDE = (4, 16) if SMALL else (64, 32)
CLIP, NOISE = 1.0, 1.1


class Net(nn.Module):
    """Three 3x3 convolutions with GroupNorm (per-example gradients need no batch statistics), a 10-way head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.GroupNorm(8, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.GroupNorm(8, 128), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; `target` (the second input, for `train_step`) is not used by a forward alone."""
        return self.head(self.features(x).flatten(1))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model in training mode, its SGD attached, and (a batch of 32x32 images, their labels)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net().to(device).train()
    model.optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # type: ignore[assignment]
    return model, (torch.randn(BATCH, 3, SIDE, SIDE, device=device), torch.randint(0, 10, (BATCH,), device=device))


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One DP-SGD step: per-example gradients, clipped, summed, noised, applied."""
    x, target = inputs
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, ti: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, p, (xi[None],)), ti[None])

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, target)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_example.values()]).norm(dim=0)
    scale = (CLIP / (norms + 1e-6)).clamp(max=1.0)
    optimizer = model.optimizer  # type: ignore[union-attr]
    for name, p in model.named_parameters():
        g = (per_example[name] * scale.view(-1, *[1] * (per_example[name].dim() - 1))).sum(0)
        p.grad = (g + torch.randn_like(g) * NOISE * CLIP) / x.shape[0]
    optimizer.step()
