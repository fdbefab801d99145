"""A plain training loop over batches of sequences padded to their longest (random lengths: every batch its own
shape), or all of one length (`--fixed`).

    operator-profiler profile --script ragged_batches_train.py --steps 2:3
"""

import argparse

import torch
from torch import nn


class Pooled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(x).relu().mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Pooled()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for step in range(8):
        length = 6 if args.fixed else 4 + step % 4
        loss = model(torch.randn(16, length, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
