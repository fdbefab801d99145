"""Hugging Face's BERT-base encoder (random weights, `transformers.BertModel`) on 16 sequences of 256 tokens with a
padding mask, in eval mode, under the workload contract: its output is a `ModelOutput` (a dict-like dataclass), not a
tensor. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (2 layers of width 64, 2 sequences of 16 tokens)."""

from __future__ import annotations

import os

import torch
from transformers import BertConfig, BertModel


def get_model_and_input() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The encoder in eval mode, its token ids and attention mask, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = (BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
              if small else BertConfig())
    batch, length = (2, 16) if small else (16, 256)
    torch.manual_seed(0)
    model = BertModel(config).to(device).eval()
    ids = torch.randint(config.vocab_size, (batch, length), device=device)
    mask = torch.ones(batch, length, dtype=torch.long, device=device)
    mask[:, length * 3 // 4:] = 0  # a quarter of each sequence is padding
    return model, (ids, mask)
