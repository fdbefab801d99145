"""A workload that prints torch's intra-op thread count as it builds and at every call (the CPU-share test)."""

from __future__ import annotations

import torch


class Counting(torch.nn.Module):
    """Doubles its input; prints the thread count each call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print(f"threads call {torch.get_num_threads()}", flush=True)
        return x * 2


def get_model_and_input() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The model and its input; prints the thread count as it builds."""
    print(f"threads build {torch.get_num_threads()}", flush=True)
    return Counting(), (torch.ones(4),)
