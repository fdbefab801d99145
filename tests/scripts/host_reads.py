"""A plain loop that reads tensors' values in Python every step: a `bool()` of a check, an `int()` of a count and a
formatted loss (each a copy to the host and, on a GPU, a wait)."""

import torch


def step(x: torch.Tensor) -> torch.Tensor:
    y = torch.tanh(x @ x.T)
    if (y > 2).any():
        raise ValueError("tanh above 2")
    count = int((y > 0).sum())
    print(f"positive: {count}, mean {y.mean():.3f}")
    return y


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    for _ in range(6):
        x = step(x)


if __name__ == "__main__":
    main()
