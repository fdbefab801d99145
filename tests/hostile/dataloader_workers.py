"""Starts persistent DataLoader workers that keep the process's stdout open after the window."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def get_model_and_input():
    loader = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8, num_workers=2, persistent_workers=True)
    (batch,) = next(iter(loader))
    get_model_and_input.loader = loader  # the workers live on with the loader
    return torch.nn.Linear(8, 4).eval(), (batch,)
