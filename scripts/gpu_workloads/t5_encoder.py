"""A T5-style encoder (written here, random weights): RMS normalisation without a mean, attention written by hand
with a learned relative-position bias added to the scores (log-spaced buckets, shared by every layer), a gated-GELU
feed-forward, no biases; 6 layers of width 512, 8 heads, 16 sequences of 256 tokens, in eval mode, under the workload
contract. The bias is what keeps the attention off a plain `scaled_dot_product_attention` flash path.
Its folder must be on the path (it takes decoder_stack.py's gated MLP).
`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (2 layers of width 64, 2 sequences of 32 tokens)."""

from __future__ import annotations

import math
import os

import torch
from decoder_stack import SwiGLU
from torch import nn


class RMSNorm(nn.Module):
    """T5's layer norm: scale only, no mean subtracted, no bias."""

    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(x.dtype)


class RelativeBias(nn.Module):
    """A learned bias per head for each bucket of the key's offset from the query (exact near, log-spaced far)."""

    def __init__(self, heads: int, buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        self.embedding, self.buckets, self.max_distance = nn.Embedding(buckets, heads), buckets, max_distance

    def forward(self, length: int) -> torch.Tensor:
        position = torch.arange(length, device=self.embedding.weight.device)
        offset = position[None, :] - position[:, None]
        half = self.buckets // 2
        bucket = (offset > 0).long() * half
        distance = offset.abs()
        exact = half // 2
        far = (exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
                        * (half - exact)).long()).clamp(max=half - 1)
        bucket = bucket + torch.where(distance < exact, distance, far)
        return self.embedding(bucket).permute(2, 0, 1)[None]  # (1, heads, length, length)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) + bias  # T5 does not scale the scores
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return self.o((weights @ v).transpose(1, 2).reshape(batch, length, width))


class GatedGelu(SwiGLU):
    """decoder_stack's gated MLP with T5's tanh-approximated GELU in place of SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.gate(x), approximate="tanh") * self.up(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attention = RMSNorm(width), Attention(width, heads)
        self.norm2, self.ffn = RMSNorm(width), GatedGelu(width, hidden)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), bias)
        return x + self.ffn(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.bias = RelativeBias(heads)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        bias = self.bias(ids.shape[1])
        for block in self.blocks:
            x = block(x, bias)
        return self.norm(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The encoder in eval mode and its token ids, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    width, heads, hidden, layers, batch, length = (64, 4, 128, 2, 2, 32) if small else (512, 8, 1024, 6, 16, 256)
    torch.manual_seed(0)
    model = Encoder(32128, width, heads, hidden, layers).to(device).eval()
    return model, (torch.randint(32128, (batch, length), device=device),)
