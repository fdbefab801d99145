"""A plain training script that updates its parameters by hand (no torch.optim): argparse, the `__main__` guard."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    data, target = torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device)
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None


if __name__ == "__main__":
    main()
