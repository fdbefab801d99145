"""A text classifier on `nn.TransformerEncoder` (pre-norm, 2 layers, width 128, 16 sequences of 64 tokens): a small,
host-bound transformer whose eager forward under `no_grad` takes PyTorch's fused encoder fast path."""

from __future__ import annotations

import torch
from torch import nn


class TextClassifier(nn.Module):
    """Token embedding -> TransformerEncoder -> mean over tokens -> linear head."""

    def __init__(self, vocab: int = 1000, width: int = 128, heads: int = 4, layers: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tokens)).mean(dim=1))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode) and one batch of token ids, on CUDA when available."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TextClassifier().to(device).eval()
    return model, (torch.randint(0, 1000, (16, 64), device=device),)
