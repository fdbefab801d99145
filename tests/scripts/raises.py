"""A workload whose model raises during the forward pass."""

import torch


class Broken(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("shape mismatch in layer 3")


def get_model_and_input():
    return Broken(), (torch.randn(2, 2),)
