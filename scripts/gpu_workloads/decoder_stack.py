"""A Llama-style decoder stack (RMSNorm, causal attention through `scaled_dot_product_attention` with its own q, k,
v and output projections, a SwiGLU MLP; 4 blocks of width 2048, 16 heads, MLP width 5632) on 8 sequences of 512
tokens in eval mode (`small`: 2 blocks of width 256 on 2 sequences of 32): a model whose time is its GEMMs, as a
large language model's prefill is."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned scale."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal multi-head self-attention: q, k, v and output projections around SDPA."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (p(x).view(batch, tokens, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(batch, tokens, width))


class SwiGLU(nn.Module):
    """The gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm attention and MLP, each with its residual."""

    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.attn, self.mlp = Attention(width, heads), SwiGLU(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DecoderStack(nn.Module):
    """The blocks and a final norm over token embeddings (no vocabulary: the input is the embeddings)."""

    def __init__(self, width: int, heads: int, hidden: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width, heads, hidden) for _ in range(depth)))
        self.norm = RMSNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.blocks(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model in eval mode and its input embeddings, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, tokens, width, heads, hidden, depth = (2, 32, 256, 4, 512, 2) if small else (8, 512, 2048, 16, 5632, 4)
    model = DecoderStack(width, heads, hidden, depth).eval().to(device)
    for p in model.parameters():  # weights at a trained model's scale: the residual stream stays O(1)
        if p.dim() == 2:
            nn.init.normal_(p, std=width**-0.5)
    return model, (torch.randn(batch, tokens, width, device=device),)
