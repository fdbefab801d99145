"""Rank 1 fails while building its model; rank 0 waits in DDP's first broadcast for it (a hang, unless the
launcher stops it)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def get_model_and_input():
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 cannot build its model")
    return DistributedDataParallel(nn.Linear(8, 8)), (torch.randn(4, 8),)
