"""ddp_lm_train.py's language model and step with uneven data: the last rank's batch holds twice the sequences of
the others' (16 against 8 of 512 tokens), as with a sampler that does not balance the ranks. That rank's forward and
backward take longer, and the other ranks wait for it in every all-reduce of DDP's buckets: a straggler that is
the workload's, not the profiler's (`operator-profiler run --nproc-per-node 2 --train-step`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_lm_train import DISTRIBUTED, train_step  # noqa: E402
from ddp_lm_train import get_model_and_input as _even  # noqa: E402

__all__ = ["DISTRIBUTED", "get_model_and_input", "train_step"]


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """ddp_lm_train's model and batch; on the last rank of the world the batch twice over."""
    model, (ids, targets) = _even()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and rank == world - 1:
        ids, targets = torch.cat([ids, ids.roll(1, dims=1)]), torch.cat([targets, targets.roll(1, dims=1)])
    return model, (ids, targets)
