"""A detector-style tail that torch.compile cannot compile (CPU, for the tests): a boolean-mask filter inside a loop
over the batch. The mask's data-dependent shape breaks the graph inside the loop, so Dynamo skips the whole forward
and runs it eagerly."""

from __future__ import annotations

import torch
from torch import nn


class MaskedLoop(nn.Module):
    """A Linear scoring rows, then per sample the rows scored above 0 refined by a second Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(8, 1)
        self.refine = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.score(x).squeeze(-1)
        out = []
        for i in range(x.shape[0]):
            kept = x[i][scores[i] > 0]  # the graph breaks here: a shape the data decides
            out.append(self.refine(kept).sum(0))
        return torch.stack(out)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The model (eval) and 4 samples of 16 rows on the CPU."""
    torch.manual_seed(0)
    return MaskedLoop().eval(), (torch.randn(4, 16, 8),)
