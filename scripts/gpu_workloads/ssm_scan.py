"""A Mamba-style selective state-space model: two blocks, each a gated projection, a causal depthwise conv1d and a
selective scan written as a Python loop over the sequence (batch 8, 32 steps, d_model 256, state 16)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelectiveSSM(nn.Module):
    """One block: a gated input projection, a causal depthwise conv1d, and the selective scan over the sequence."""

    def __init__(self, d_model: int = 256, d_state: int = 16, expand: int = 2) -> None:
        super().__init__()
        inner = expand * d_model
        self.d_state = d_state
        self.norm = nn.LayerNorm(d_model)
        self.in_proj = nn.Linear(d_model, 2 * inner)
        self.conv = nn.Conv1d(inner, inner, 4, groups=inner, padding=3)
        self.x_proj = nn.Linear(inner, 2 * d_state + 8)
        self.dt_proj = nn.Linear(8, inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1).float()).repeat(inner, 1))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's residual output for `x` (batch, length, d_model)."""
        batch, length, _ = x.shape
        xi, z = self.in_proj(self.norm(x)).chunk(2, -1)
        xi = F.silu(self.conv(xi.transpose(1, 2))[..., :length].transpose(1, 2))
        b, c, dt = self.x_proj(xi).split([self.d_state, self.d_state, 8], -1)
        dt = F.softplus(self.dt_proj(dt))
        a = -torch.exp(self.A_log)
        h = x.new_zeros(batch, xi.shape[-1], self.d_state)
        ys = []
        for t in range(length):
            step = dt[:, t, :, None]
            h = torch.exp(step * a) * h + step * b[:, t, None, :] * xi[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        y = torch.stack(ys, 1) + xi * self.D
        return x + self.out_proj(y * F.silu(z))


class SSMStack(nn.Module):
    """`layers` blocks and a linear head."""

    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[SelectiveSSM() for _ in range(layers)])
        self.head = nn.Linear(256, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The head's output after every block."""
        return self.head(self.blocks(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model (eval) and one batch of 8 sequences of 32 steps, on the GPU when there is one."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return SSMStack().to(device).eval(), (torch.randn(8, 32, 256, device=device),)
