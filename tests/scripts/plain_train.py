"""A plain training script, written as people write them (argparse, a Dataset read by DataLoader worker processes,
the `__main__` guard), with nothing of Operator Profiler in it:

    operator-profiler profile --script plain_train.py -- --epochs 2 --workers 2

`--compile` trains the model through `torch.compile`, as many scripts do; `--ema` keeps an average of the weights,
updated after every step by one multi-tensor `torch._foreach_lerp_`.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Points(Dataset):
    """Random points and a label that depends on them."""

    def __init__(self, count: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 16, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def train(args: argparse.Namespace) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(Points(args.samples), batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = Classifier().to(device)
    forward = torch.compile(model) if args.compile else model
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    average = [p.detach().clone() for p in model.parameters()] if args.ema else []
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(forward(x), y)
            loss.backward()
            optimizer.step()
            if average:
                torch._foreach_lerp_(average, [p.detach() for p in model.parameters()], 0.01)
        print(f"epoch {epoch}: loss {loss.item():.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--compile", action="store_true", help="train through torch.compile(model)")
    parser.add_argument("--ema", action="store_true", help="keep an average of the weights after every step")
    train(parser.parse_args())
