"""Spends its forward in a multiprocessing pool: the window runs mostly outside torch operators."""

import multiprocessing

import torch


def _busy(n):
    return sum(i * i for i in range(n))


class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        with multiprocessing.get_context("fork").Pool(2) as pool:
            pool.map(_busy, [200_000] * 4)
        return self.linear(x)


def get_model_and_input():
    return Pooled().eval(), (torch.randn(4, 16),)
