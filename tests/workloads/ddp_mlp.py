"""A data-parallel training step of an MLP: the harness wraps the model in DDP (`DISTRIBUTED = "ddp"`)."""

import torch
from torch import nn

DISTRIBUTED = "ddp"


def get_model_and_input():
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 16))
    x = torch.randn(64, 256)
    target = torch.randint(0, 16, (64,))
    if torch.cuda.is_available():
        model, x, target = model.cuda(), x.cuda(), target.cuda()
    return model, (x, target)


def train_step(model, inputs):
    x, target = inputs
    nn.functional.cross_entropy(model(x), target).backward()
