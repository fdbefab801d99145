"""A 4-layer transformer encoder (d_model 512, 8 heads, feed-forward 2048) trained one step with AdamW on a batch
of 16 sequences of 256 tokens' embeddings (`small`: d_model 32, 2 heads, 2 sequences of 8)."""

from __future__ import annotations

import os

import torch
from torch import nn


class Encoder(nn.Module):
    """Stacked encoder layers and a linear head."""

    def __init__(self, d_model: int, heads: int, ff: int, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, batch_first=True, dropout=0.0)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The head's output; `target` (the second input, for `train_step`) is not used by a forward alone."""
        return self.head(self.layers(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model in training mode, its optimizer attached, and (inputs, targets)."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    d_model, heads, ff, batch, seq = (32, 2, 64, 2, 8) if small else (512, 8, 2048, 16, 256)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Encoder(d_model, heads, ff, 4).to(device).train()
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # type: ignore[assignment]
    x = torch.randn(batch, seq, d_model, device=device)
    return model, (x, torch.randn_like(x))


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One optimizer step on the mean squared error of the model's output."""
    x, target = inputs
    optimizer = model.optimizer if hasattr(model, "optimizer") else model._orig_mod.optimizer  # type: ignore[union-attr]
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
