"""ddp_lm_train.py's language model sharded with FSDP2 (`fully_shard` on every block, then on the root) over the
ranks of `operator-profiler run --nproc-per-node N`: each block's parameters are all-gathered before its forward
and backward and its gradients reduce-scattered after; AdamW steps each rank's shards."""

from __future__ import annotations

import torch
from ddp_lm_train import LanguageModel, sizes, train_step  # noqa: F401 - the same step
from torch import nn
from torch.distributed.fsdp import fully_shard


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The sharded model with its optimizer attached, and (token ids, next-token targets)."""
    vocab, seq, d_model, heads, layers, batch = sizes()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = LanguageModel(vocab, seq, d_model, heads, layers).to(device).train()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # type: ignore[assignment]
    ids = torch.randint(0, vocab, (batch, seq + 1), device=device)
    return model, (ids[:, :-1].contiguous(), ids[:, 1:].contiguous())
