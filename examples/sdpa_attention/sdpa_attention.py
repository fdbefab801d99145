"""Multi-head self-attention built on ``torch.nn.functional.scaled_dot_product_attention``.

Architecture: separate ``q_proj``, ``k_proj`` and ``v_proj`` Linear projections, heads reshaped to
``(batch, heads, seq, head_dim)``, ``F.scaled_dot_product_attention`` (non-causal), then an ``out_proj``
Linear.

Default ("full") shapes: d_model 1024, 16 heads (head_dim 64); input ``(8, 1024, 1024)`` float32
(batch, seq, d_model); output has the same shape.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (d_model 64, 4 heads, input ``(2, 32, 64)``). The default is ``full``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {"d_model": 1024, "n_head": 16, "batch": 8, "seq_len": 1024},
    "small": {"d_model": 64, "n_head": 4, "batch": 2, "seq_len": 32},
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class SDPAttention(nn.Module):
    """Multi-head self-attention with q/k/v/out projections and fused scaled-dot-product attention."""

    def __init__(self, d_model: int, n_head: int) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        return x.view(batch, seq_len, self.n_head, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(1, 2).reshape(batch, seq_len, d_model)
        return self.out_proj(out)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = SDPAttention(d_model=sizes["d_model"], n_head=sizes["n_head"])
    model = model.to(device).eval()
    x = torch.randn(sizes["batch"], sizes["seq_len"], sizes["d_model"], device=device)
    return model, (x,)
