"""A plain inference script that compiles a model torch.compile cannot compile (CPU, for the tests): a boolean-mask
filter inside a loop over the batch makes Dynamo skip the whole forward and run it eagerly."""

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


def main() -> None:
    """Twelve compiled calls on 4 samples of 16 rows."""
    torch.manual_seed(0)
    model = torch.compile(MaskedLoop().eval())
    x = torch.randn(4, 16, 8)
    with torch.no_grad():
        for _ in range(12):
            model(x)


if __name__ == "__main__":
    main()
