"""A mixture-of-experts layer routed the way many are written: top-1 gating, each expert's tokens found with
`nonzero` and its outputs scattered back with `index_add_` (eager). Every `nonzero` reads its count back to the
host: the window synchronises once per expert, with data-dependent shapes. 4,096 tokens of width 1,024, 8 experts
of hidden width 4,096 (`small`: 64 tokens of 32, 4 experts of 64)."""

from __future__ import annotations

import os

import torch
from torch import nn


class Expert(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class MoE(nn.Module):
    def __init__(self, width: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, experts)
        self.experts = nn.ModuleList(Expert(width, hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.gate(x).softmax(dim=-1)
        score, choice = weights.max(dim=-1)
        out = torch.zeros_like(x)
        for number, expert in enumerate(self.experts):
            rows = (choice == number).nonzero().squeeze(1)  # data-dependent: the host waits for the count
            out.index_add_(0, rows, expert(x[rows]) * score[rows, None])
        return out


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The layer and its tokens, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    tokens, width, hidden, experts = (64, 32, 64, 4) if small else (4096, 1024, 4096, 8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    return MoE(width, hidden, experts).to(device).eval(), (torch.randn(tokens, width, device=device),)
