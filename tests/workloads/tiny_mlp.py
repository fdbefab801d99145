"""Tiny MLP baseline for the proof tests: Linear -> torch.relu -> scale and shift (mul + add) -> Linear.

Small enough that a forward pass takes microseconds on a CPU; on a GPU it runs there.
"""

from __future__ import annotations

import torch
from torch import nn

WIDTH, HIDDEN, OUT, BATCH = 16, 32, 4, 8


class TinyMLP(nn.Module):
    """fc1 -> relu -> h * scale + shift -> fc2."""

    def __init__(self, width: int = WIDTH, hidden: int = HIDDEN, out: int = OUT) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.scale = nn.Parameter(torch.rand(hidden) + 0.5)
        self.shift = nn.Parameter(torch.randn(hidden) * 0.1)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = h * self.scale + self.shift
        return self.fc2(h)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode) and one input batch, on CUDA when available."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TinyMLP().to(device).eval()
    x = torch.randn(BATCH, WIDTH, device=device)
    return model, (x,)
