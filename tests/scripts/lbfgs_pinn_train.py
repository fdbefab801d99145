"""A physics-informed fit trained by L-BFGS: `step(closure)` runs the closure (the forward, a second derivative
taken by `torch.autograd.grad(create_graph=True)` twice, the loss, its backward) up to `max_iter` times a step.

    operator-profiler profile --script lbfgs_pinn_train.py --steps 1:1
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).to(device)
    x = torch.linspace(-1, 1, 16, device=device).unsqueeze(1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=2)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        xs = x.clone().requires_grad_(True)
        u = model(xs)
        u_x = torch.autograd.grad(u.sum(), xs, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x.sum(), xs, create_graph=True)[0]
        loss = (u_xx + torch.sin(xs)).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)


if __name__ == "__main__":
    main()
