"""LSTM sequence encoder: token embedding, a 2-layer batch-first LSTM and a Linear head.

Architecture: ``embedding`` (nn.Embedding) -> ``lstm`` (nn.LSTM, 2 layers, ``batch_first=True``) ->
``head`` (nn.Linear) applied to the last layer's final hidden state.

Default ("full") shapes: vocab 10000, embedding 512, hidden 512, 2 layers, 10 classes; input token ids
``(32, 128)`` of dtype ``torch.long``; output ``(32, 10)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (vocab 500, embedding 32, hidden 32, input ``(4, 12)``). The default is ``full``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "vocab_size": 10000,
        "embed_dim": 512,
        "hidden_size": 512,
        "num_layers": 2,
        "num_classes": 10,
        "batch": 32,
        "seq_len": 128,
    },
    "small": {
        "vocab_size": 500,
        "embed_dim": 32,
        "hidden_size": 32,
        "num_layers": 2,
        "num_classes": 10,
        "batch": 4,
        "seq_len": 12,
    },
}


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class LSTMSequenceEncoder(nn.Module):
    """Embeds token ids, encodes them with an LSTM and classifies from the final hidden state."""

    def __init__(
        self, vocab_size: int, embed_dim: int, hidden_size: int, num_layers: int, num_classes: int
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        _, (h_n, _) = self.lstm(x)
        return self.head(h_n[-1])


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LSTMSequenceEncoder(
        vocab_size=sizes["vocab_size"],
        embed_dim=sizes["embed_dim"],
        hidden_size=sizes["hidden_size"],
        num_layers=sizes["num_layers"],
        num_classes=sizes["num_classes"],
    )
    model = model.to(device).eval()
    input_ids = torch.randint(
        0, sizes["vocab_size"], (sizes["batch"], sizes["seq_len"]), dtype=torch.long, device=device
    )
    return model, (input_ids,)
