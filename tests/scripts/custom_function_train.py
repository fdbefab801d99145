"""A training loop whose loss goes through a custom autograd.Function, after an index op on the batch."""

import torch
from torch import nn


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(8, 8).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 9, device=device)
    for _ in range(6):
        hidden = model(data[:, :8])
        weight = data[:, 8:]  # an op carrying the number Square's node takes next, creating no node
        loss = (Square.apply(hidden) * weight).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
