"""Forgets its return statement: returns None."""

import torch


def get_model_and_input():
    model = torch.nn.Linear(8, 4)
    inputs = (torch.randn(2, 8),)
    del model, inputs
