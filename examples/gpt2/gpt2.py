"""GPT-2 small (117M parameters) written in plain PyTorch, randomly initialised (no weights downloaded).

Architecture (mirrors the Hugging Face GPT-2 layout, but with ``nn.Linear`` instead of ``Conv1D``):
token embedding ``wte`` + position embedding ``wpe``, a stack of pre-LayerNorm blocks ``h.<i>`` each with
causal self-attention (fused QKV projection ``attn.c_attn``, output projection ``attn.c_proj``) and a GELU
MLP (``mlp.c_fc``, ``mlp.c_proj``), a final LayerNorm ``ln_f`` and an ``lm_head`` tied to ``wte``.

Default ("full") shapes: 12 layers, 12 heads, d_model 768, vocab 50257, n_positions 1024; input token ids
``(4, 128)`` of dtype ``torch.long``; output logits ``(4, 128, 50257)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (2 layers, 2 heads, d_model 64, vocab 1000, n_positions 64, input ``(2, 16)``). The default is
``full``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "n_layer": 12,
        "n_head": 12,
        "d_model": 768,
        "vocab_size": 50257,
        "n_positions": 1024,
        "batch": 4,
        "seq_len": 128,
    },
    "small": {
        "n_layer": 2,
        "n_head": 2,
        "d_model": 64,
        "vocab_size": 1000,
        "n_positions": 64,
        "batch": 2,
        "seq_len": 16,
    },
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection, computed explicitly."""

    causal_mask: torch.Tensor

    def __init__(self, d_model: int, n_head: int, n_positions: int) -> None:
        super().__init__()
        if d_model % n_head != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(n_positions, n_positions, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, n_positions, n_positions), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        q, k, v = self.c_attn(x).split(d_model, dim=2)
        q = q.view(batch, seq_len, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(batch, seq_len, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(batch, seq_len, self.n_head, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        mask = self.causal_mask[:, :, :seq_len, :seq_len]
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = F.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)
        out = out.transpose(1, 2).contiguous().view(batch, seq_len, d_model)
        return self.c_proj(out)


class MLP(nn.Module):
    """Position-wise feed-forward network: Linear (4x expansion) - GELU (tanh approx.) - Linear."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``."""

    def __init__(self, d_model: int, n_head: int, n_positions: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, n_positions)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """GPT-2 language model returning logits of shape ``(batch, seq_len, vocab_size)``."""

    position_ids: torch.Tensor

    def __init__(self, n_layer: int, n_head: int, d_model: int, vocab_size: int, n_positions: int) -> None:
        super().__init__()
        self.n_positions = n_positions
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(n_positions, d_model)
        self.h = nn.ModuleList([Block(d_model, n_head, n_positions) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.register_buffer("position_ids", torch.arange(n_positions).unsqueeze(0), persistent=False)
        self.apply(self._init_weights)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        positions = self.position_ids[:, :seq_len]
        x = self.wte(input_ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return self.lm_head(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = GPT2(
        n_layer=sizes["n_layer"],
        n_head=sizes["n_head"],
        d_model=sizes["d_model"],
        vocab_size=sizes["vocab_size"],
        n_positions=sizes["n_positions"],
    )
    model = model.to(device).eval()
    input_ids = torch.randint(
        0, sizes["vocab_size"], (sizes["batch"], sizes["seq_len"]), dtype=torch.long, device=device
    )
    return model, (input_ids,)


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One forward + backward pass with a next-token cross-entropy loss (no optimizer step).

    The targets are the input ids shifted left by one position, so they are derived deterministically
    from the inputs.
    """
    (input_ids,) = inputs
    logits = model(input_ids)
    vocab_size = logits.shape[-1]
    loss = F.cross_entropy(
        logits[:, :-1, :].reshape(-1, vocab_size).float(),
        input_ids[:, 1:].reshape(-1),
    )
    loss.backward()
    return loss
