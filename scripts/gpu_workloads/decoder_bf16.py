"""A decoder-only LM loaded in bfloat16, as `from_pretrained(torch_dtype=torch.bfloat16)` leaves one (4 pre-norm
blocks of width 512 with causal SDPA, vocabulary 8192, 8 sequences of 256 tokens): the workload as written computes in
bfloat16, so the free frontier's reference is bfloat16 eager, not fp32 (`recipes.json`'s `written_error`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """LayerNorm -> causal self-attention -> residual; LayerNorm -> GELU MLP -> residual."""

    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class LM(nn.Module):
    """Embedding -> blocks -> LayerNorm -> vocabulary head."""

    def __init__(self, vocab: int = 8192, d: int = 512, h: int = 8, n: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model in bfloat16 (eval mode) and one batch of token ids, on CUDA when available."""
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LM().to(dev, torch.bfloat16).eval()
    return model, (torch.randint(0, 8192, (8, 256), device=dev),)
