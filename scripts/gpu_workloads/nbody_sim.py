"""A plain simulation script with no nn.Module and no optimizer: N bodies under softened gravity, integrated by
leapfrog steps, the pairwise forces from one `torch.cdist` and a matrix product each step, the energy read back to
the host every few steps (`.item()`) to watch it drift. argparse and the `__main__` guard; nothing of Operator
Profiler in it. Its steps are calls of `leapfrog`:

    operator-profiler run --script scripts/gpu_workloads/nbody_sim.py --window-fn leapfrog --steps 5:5

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch

SIZES = {"gpu": {"bodies": 8192, "steps": 200}, "small": {"bodies": 64, "steps": 40}}
SOFTENING = 1e-2


def accelerations(pos: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Each body's acceleration from every other: sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)."""
    dist = torch.cdist(pos, pos)
    inv3 = (dist.square() + SOFTENING ** 2).pow(-1.5)
    inv3.fill_diagonal_(0.0)
    weighted = inv3 * mass[None, :]
    return weighted @ pos - weighted.sum(dim=1, keepdim=True) * pos


def energy(pos: torch.Tensor, vel: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Kinetic plus potential energy."""
    kinetic = 0.5 * (mass * vel.square().sum(dim=1)).sum()
    inv = (torch.cdist(pos, pos).square() + SOFTENING ** 2).rsqrt()
    inv.fill_diagonal_(0.0)
    return kinetic - 0.5 * (mass[:, None] * mass[None, :] * inv).sum()


def leapfrog(pos: torch.Tensor, vel: torch.Tensor, mass: torch.Tensor, dt: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One kick-drift-kick step."""
    vel = vel + 0.5 * dt * accelerations(pos, mass)
    pos = pos + dt * vel
    vel = vel + 0.5 * dt * accelerations(pos, mass)
    return pos, vel


def main() -> None:
    """Simulate and print the relative energy drift."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=sizes["bodies"])
    parser.add_argument("--steps", type=int, default=sizes["steps"])
    parser.add_argument("--dt", type=float, default=1e-3)
    parser.add_argument("--check-every", type=int, default=10, help="steps between energy read-backs")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device="cpu").manual_seed(0)
    pos = torch.randn(args.bodies, 3, generator=gen).to(device)
    vel = 0.1 * torch.randn(args.bodies, 3, generator=gen).to(device)
    mass = torch.rand(args.bodies, generator=gen).to(device) / args.bodies
    start = energy(pos, vel, mass).item()
    for step in range(args.steps):
        pos, vel = leapfrog(pos, vel, mass, args.dt)
        if (step + 1) % args.check_every == 0:
            drift = (energy(pos, vel, mass).item() - start) / abs(start)
            print(f"step {step + 1}: energy drift {drift:+.2e}")


if __name__ == "__main__":
    main()
