"""A plain inference script that compiles a model torch.compile cannot compile (CPU, for the tests): the model of
tests/workloads/masked_loop.py, whose boolean-mask filter inside a loop over the batch makes Dynamo skip the whole
forward and run it eagerly."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
from masked_loop import MaskedLoop  # noqa: E402 - the same model as the contract workload


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
