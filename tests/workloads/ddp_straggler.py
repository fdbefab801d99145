"""A data-parallel training step whose last rank is late: it sleeps STRAGGLER_DELAY_S before every step, so the
others wait for it in every all-reduce. The workload wraps its own DDP, with small buckets (several
all-reduces per step)."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STRAGGLER_DELAY_S = float(os.environ.get("STRAGGLER_DELAY_S", "0.2"))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(128, 256)
        self.body = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 8)

    def forward(self, x):
        return self.head(self.body(self.embed(x)))


def get_model_and_input():
    model = DistributedDataParallel(Net(), bucket_cap_mb=0.25)
    return model, (torch.randn(32, 128), torch.randint(0, 8, (32,)))


def train_step(model, inputs):
    if dist.get_rank() == dist.get_world_size() - 1:
        time.sleep(STRAGGLER_DELAY_S)
    x, target = inputs
    nn.functional.cross_entropy(model(x), target).backward()
