"""A plain training script for a physics-informed network: an MLP u(x, t) fitted to the viscous Burgers equation
u_t + u u_x = nu u_xx on collocation points, its derivatives taken by `torch.autograd.grad(create_graph=True)`, the
boundary and initial conditions as a second loss, trained by L-BFGS, whose `step(closure)` runs the forward and the
backward itself (up to `max_iter` times a step, with a strong-Wolfe line search that reads the loss on the host).
argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/pinn_lbfgs.py --steps 1:2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn

SIZES = {"gpu": {"width": 256, "depth": 6, "points": 16384, "boundary": 2048, "max_iter": 5},
         "small": {"width": 16, "depth": 3, "points": 128, "boundary": 32, "max_iter": 2}}

NU = 0.01 / math.pi


class Field(nn.Module):
    """(x, t) points (n, 2) -> u (n, 1): a tanh MLP."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(2, width), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, xt: torch.Tensor) -> torch.Tensor:
        return self.net(xt)


def residual(model: nn.Module, xt: torch.Tensor) -> torch.Tensor:
    """Burgers' residual u_t + u u_x - nu u_xx at the collocation points."""
    xt = xt.requires_grad_(True)
    u = model(xt)
    grads = torch.autograd.grad(u.sum(), xt, create_graph=True)[0]
    u_x, u_t = grads[:, :1], grads[:, 1:]
    u_xx = torch.autograd.grad(u_x.sum(), xt, create_graph=True)[0][:, :1]
    return u_t + u * u_x - NU * u_xx


def boundary_points(count: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Initial condition u(x, 0) = -sin(pi x) and walls u(+-1, t) = 0: points and their targets."""
    x0 = torch.rand(count, 1, device=device) * 2 - 1
    initial = torch.cat([x0, torch.zeros_like(x0)], dim=1)
    t = torch.rand(count, 1, device=device)
    walls = torch.cat([torch.where(torch.rand_like(t) < 0.5, -1.0, 1.0), t], dim=1)
    points = torch.cat([initial, walls])
    targets = torch.cat([-torch.sin(math.pi * x0), torch.zeros_like(t)])
    return points, targets


def main() -> None:
    """Fit the field with `--steps` L-BFGS steps, printing the loss after each."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-iter", type=int, default=sizes["max_iter"], help="closure calls per L-BFGS step")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Field(sizes["width"], sizes["depth"]).to(device)
    collocation = torch.cat([torch.rand(sizes["points"], 1) * 2 - 1, torch.rand(sizes["points"], 1)], 1).to(device)
    edges, targets = boundary_points(sizes["boundary"], device)
    opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=args.max_iter, history_size=20,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = residual(model, collocation.clone()).pow(2).mean() + nn.functional.mse_loss(model(edges), targets)
        loss.backward()
        return loss

    for step in range(args.steps):
        loss = opt.step(closure)
        print(f"step {step}: loss {float(loss.detach()):.4e}")


if __name__ == "__main__":
    main()
