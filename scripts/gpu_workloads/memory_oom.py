"""An MLP tower whose saved activations outgrow an 80 GiB GPU: 16 blocks of Linear(8192, 8192) and GELU over a
batch of 262144 rows, trained one step (each block saves 16 GiB for backward). It runs out of memory in the first
forward, inside one of the first blocks: the memory pass's out-of-memory workload (`small`: fits anywhere)."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F


class Tower(nn.Module):
    """`blocks.N` = Linear then GELU, and a one-output head."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The head's output; `target` is for `train_step`."""
        return self.head(self.blocks(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The tower with its SGD attached, and (inputs, targets)."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    width, depth, batch = (16, 2, 8) if small else (8192, 16, 262144)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Tower(width, depth).to(device).train()
    model.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # type: ignore[assignment]
    return model, (torch.randn(batch, width, device=device), torch.randn(batch, 1, device=device))


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One SGD step on the mean squared error."""
    x, target = inputs
    loss = F.mse_loss(model(x), target)
    loss.backward()
    model.optimizer.step()  # type: ignore[operator]
    model.optimizer.zero_grad(set_to_none=True)  # type: ignore[operator]
