"""A plain training loop that evaluates its model under `torch.no_grad()` after every third step.

    operator-profiler profile --script eval_in_loop_train.py --steps 3:1
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    held_out = torch.randn(32, 8)
    for step in range(9):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 2:
            with torch.no_grad():
                print(f"step {step}: held-out loss {model(held_out).pow(2).mean().item():.3f}")


if __name__ == "__main__":
    main()
