"""A plain training script that compiles its optimizer's step only, as PyTorch's compiled-optimizer recipe does: the
learning rate a tensor (so that the schedule does not recompile the step), `optimizer.step()` in a function under
`torch.compile`."""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01))
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.99)

    @torch.compile
    def update() -> None:
        optimizer.step()

    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(6):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        update()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
