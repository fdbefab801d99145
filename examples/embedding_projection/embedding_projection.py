"""Embedding + LayerNorm + feed-forward network + vocabulary projection (a language-model-head workload).

Architecture: ``embedding`` (nn.Embedding) -> ``norm`` (LayerNorm) -> ``ffn`` (Linear 4x expansion, GELU,
Linear) with a residual connection -> ``logits`` (Linear projecting to the vocabulary).

Default ("full") shapes: vocab 32000, d_model 1024, FFN hidden 4096; input token ids ``(16, 256)`` of dtype
``torch.long``; output logits ``(16, 256, 32000)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (vocab 1000, d_model 64, FFN hidden 256, input ``(2, 16)``). The default is ``full``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {"vocab_size": 32000, "d_model": 1024, "d_ff": 4096, "batch": 16, "seq_len": 256},
    "small": {"vocab_size": 1000, "d_model": 64, "d_ff": 256, "batch": 2, "seq_len": 16},
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class FeedForward(nn.Module):
    """Linear - GELU - Linear."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EmbeddingProjection(nn.Module):
    """Token embedding, LayerNorm, residual FFN and a projection to vocabulary logits."""

    def __init__(self, vocab_size: int, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff)
        self.logits = nn.Linear(d_model, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embedding(input_ids))
        x = x + self.ffn(x)
        return self.logits(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = EmbeddingProjection(vocab_size=sizes["vocab_size"], d_model=sizes["d_model"], d_ff=sizes["d_ff"])
    model = model.to(device).eval()
    input_ids = torch.randint(
        0, sizes["vocab_size"], (sizes["batch"], sizes["seq_len"]), dtype=torch.long, device=device
    )
    return model, (input_ids,)
