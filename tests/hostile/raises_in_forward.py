"""Raises from a helper its forward calls, three frames below the model: the whole traceback must reach the log."""

import torch


def _check_scale(value):
    raise ValueError(f"scale must be positive, got {value}")


class Scaled(torch.nn.Module):
    def forward(self, x):
        _check_scale(-1)
        return x


def get_model_and_input():
    return Scaled(), (torch.randn(2, 2),)
