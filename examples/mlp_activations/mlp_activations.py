"""Deep MLP exercising many activation functions.

Architecture: ``layers.<i>`` are 8 blocks, each a ``linear`` (nn.Linear) followed by an ``act``, cycling
through ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU, ELU and Hardswish; a final ``head`` Linear produces
the output.

Default ("full") shapes: width 2048, 8 hidden layers, 1000 outputs; input ``(512, 2048)`` float32; output
``(512, 1000)``.

Set the environment variable ``OPERATOR_PROFILER_EXAMPLE_SCALE=small`` to shrink the workload for quick
CPU tests (width 64, 8 hidden layers, 10 outputs, input ``(8, 64)``). The default is ``full``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

SCALE_ENV_VAR = "OPERATOR_PROFILER_EXAMPLE_SCALE"

SIZES: dict[str, dict[str, Any]] = {
    "full": {"batch": 512, "width": 2048, "num_layers": 8, "out_features": 1000},
    "small": {"batch": 8, "width": 64, "num_layers": 8, "out_features": 10},
}

ACTIVATIONS: tuple[Callable[[], nn.Module], ...] = (
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.Hardswish,
)


def get_sizes() -> dict[str, Any]:
    """Return the size table selected by ``OPERATOR_PROFILER_EXAMPLE_SCALE`` (``full`` or ``small``)."""
    scale = os.environ.get(SCALE_ENV_VAR, "full")
    if scale not in SIZES:
        raise ValueError(f"OPERATOR_PROFILER_EXAMPLE_SCALE must be 'full' or 'small', got {scale!r}")
    return SIZES[scale]


class LinearAct(nn.Module):
    """A Linear layer followed by an activation module."""

    def __init__(self, in_features: int, out_features: int, act: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


class DeepMLP(nn.Module):
    """Stack of ``LinearAct`` blocks with cycling activation types, then a Linear head."""

    def __init__(self, width: int, num_layers: int, out_features: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[LinearAct(width, width, ACTIVATIONS[i % len(ACTIVATIONS)]()) for i in range(num_layers)]
        )
        self.head = nn.Linear(width, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the model (eval mode) and its positional inputs on CUDA if available, else CPU."""
    sizes = get_sizes()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DeepMLP(width=sizes["width"], num_layers=sizes["num_layers"], out_features=sizes["out_features"])
    model = model.to(device).eval()
    x = torch.randn(sizes["batch"], sizes["width"], device=device)
    return model, (x,)


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """One forward + backward pass with a simple scalar loss (no optimizer step)."""
    out = model(*inputs)
    loss = out.float().pow(2).mean()
    loss.backward()
    return loss
