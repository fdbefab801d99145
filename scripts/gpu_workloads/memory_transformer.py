"""A GPT-style decoder of about 110 M parameters (12 blocks, d_model 768, 12 heads, vocabulary 16384) trained one
step with AdamW on 8 sequences of 1024 tokens: the memory pass's training-step workload (`small`: 2 blocks of
d_model 32 over 2 sequences of 16 tokens)."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    """Causal self-attention through scaled_dot_product_attention."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    """Pre-norm attention and MLP, each with its residual."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class Decoder(nn.Module):
    """Token and position embeddings, the blocks, a final norm and the vocabulary head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits; `targets` (the second input, for `train_step`) is not used by a forward alone."""
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model in training mode with its AdamW attached, and (tokens, next tokens)."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    vocab, seq, d_model, heads, layers, batch = (64, 16, 32, 2, 2, 2) if small else (16384, 1024, 768, 12, 12, 8)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Decoder(vocab, seq, d_model, heads, layers).to(device).train()
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # type: ignore[assignment]
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    return model, (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One AdamW step on the next-token cross entropy; the gradients are freed after it."""
    idx, targets = inputs
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    model.optimizer.step()  # type: ignore[operator]
    model.optimizer.zero_grad(set_to_none=True)  # type: ignore[operator]
