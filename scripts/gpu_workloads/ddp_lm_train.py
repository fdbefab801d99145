"""A GPT-style language model (6 causal blocks, d_model 768, 12 heads) trained one AdamW step per call on 8 sequences
of 512 tokens, data-parallel: the harness wraps it in DDP (`DISTRIBUTED = "ddp"`) on every rank of
`operator-profiler run --nproc-per-node N`. About 60 M parameters: each step all-reduces about 240 MB of float32
gradients in DDP's buckets while the backward runs (`small`: d_model 32, 2 heads, 2 blocks, 2 sequences of 16)."""

from __future__ import annotations

import os

import torch
from torch import nn

DISTRIBUTED = "ddp"


class Block(nn.Module):
    """Pre-norm causal self-attention (SDPA) and a GELU MLP."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x + attention(ln1(x)), then + mlp(ln2(...))."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class LanguageModel(nn.Module):
    """Token and position embeddings, the blocks, a final norm and a tied output head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, layers: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary for every position."""
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.t()


def sizes() -> tuple[int, int, int, int, int, int]:
    """(vocab, seq, d_model, heads, layers, batch) at the scale the environment asks for."""
    if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small":
        return 128, 16, 32, 2, 2, 2
    return 8192, 512, 768, 12, 6, 8


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model in training mode with its optimizer attached, and (token ids, next-token targets)."""
    vocab, seq, d_model, heads, layers, batch = sizes()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = LanguageModel(vocab, seq, d_model, heads, layers).to(device).train()
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # type: ignore[assignment]
    ids = torch.randint(0, vocab, (batch, seq + 1), device=device)
    return model, (ids[:, :-1].contiguous(), ids[:, 1:].contiguous())


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One AdamW step on the next-token cross-entropy."""
    ids, targets = inputs
    optimizer = getattr(model, "module", model).optimizer  # the harness hands the model in DDP's wrapper
    optimizer.zero_grad(set_to_none=True)
    logits = model(ids)
    nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1)).backward()
    optimizer.step()
