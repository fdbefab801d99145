"""Prints 10 MB while it builds its model, then profiles normally."""

import torch


def get_model_and_input():
    line = "y" * 1000
    for _ in range(10_000):
        print(line)
    return torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),)
