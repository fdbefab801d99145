"""A second small, well-behaved workload (another model than tests/workloads/tiny_mlp.py)."""

import torch


def get_model_and_input():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).eval()
    return model, (torch.randn(4, 8),)
