"""A plain inference loop that repeats each row of its batch: by a number (`--repeats 4`: beam search's expansion,
whose output shape follows from the input's) or by a tensor of counts (`--counts`: a shape read from the data).

    operator-profiler profile --script repeat_beams.py --window-fn expand
"""

import argparse

import torch
from torch import nn


def expand(model: nn.Module, x: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
    out = model(x)
    if counts is None:
        return out.repeat_interleave(4, dim=0)
    return out.repeat_interleave(counts, dim=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    with torch.no_grad():
        for _ in range(6):
            counts = torch.randint(1, 4, (16,)) if args.counts else None
            expand(model, torch.randn(16, 8), counts)


if __name__ == "__main__":
    main()
