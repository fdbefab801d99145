"""Tiny recommender whose inputs carry structure: EmbeddingBag offsets (the first 0, non-decreasing) and token
sequences that must open with the BOS token (the model refuses any other)."""

from __future__ import annotations

import torch
from torch import nn

ROWS, DIM, BATCH, BOS = 50, 8, 6, 1


class TinyBag(nn.Module):
    """Bag of features (EmbeddingBag over offsets) + mean of token embeddings -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        self.tokens = nn.Embedding(ROWS, DIM)
        self.out = nn.Linear(2 * DIM, 2)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        bags = self.bag(indices, offsets)
        if bool((tokens[:, 0] != BOS).any()):
            raise ValueError("every sequence must open with the BOS token")
        return self.out(torch.cat([bags, self.tokens(tokens).mean(1)], dim=1))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode) and one batch: 4 indices per bag, sequences of 5 tokens after BOS."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    indices = torch.randint(2, ROWS, (4 * BATCH,), device=device)
    offsets = torch.arange(0, 4 * BATCH, 4, device=device)
    body = torch.randint(2, ROWS, (BATCH, 5), device=device)
    tokens = torch.cat([torch.full((BATCH, 1), BOS, device=device), body], dim=1)
    return TinyBag().to(device).eval(), (indices, offsets, tokens)
