"""A fully sharded training step (FSDP2's `fully_shard`): each block is its own unit, the root holds the rest.
Every unit's parameters are all-gathered before its forward and backward, its gradients reduce-scattered after."""

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(128, 256)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(3)])
        self.head = nn.Linear(256, 8)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def get_model_and_input():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net().to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, (torch.randn(32, 128, device=device), torch.randint(0, 8, (32,), device=device))


def train_step(model, inputs):
    x, target = inputs
    nn.functional.cross_entropy(model(x), target).backward()
