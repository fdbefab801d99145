"""A plain adversarial training loop with two models and an optimizer each: every iteration the critic steps, then
the generator through it (as a GAN trains). `--critic-steps N` steps the critic N times per generator step (as a
WGAN trains); `--generator-from K` starts stepping the generator only at iteration K; `--gradient-penalty` adds
WGAN-GP's penalty to the critic's loss (a gradient taken with `create_graph=True`, differentiated again).

    operator-profiler profile --script two_optimizer_train.py
"""

import argparse

import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.body(z)


class Critic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).flatten()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--critic-steps", type=int, default=1)
    parser.add_argument("--generator-from", type=int, default=0)
    parser.add_argument("--gradient-penalty", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    gen, critic = Generator(), Critic()
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_c = torch.optim.SGD(critic.parameters(), lr=1e-2)
    for iteration in range(args.iterations):
        for _ in range(args.critic_steps):
            real = torch.randn(8, 8)
            fake = gen(torch.randn(8, 4)).detach()
            opt_c.zero_grad()
            loss_c = critic(fake).mean() - critic(real).mean()
            if args.gradient_penalty:
                points = (real + fake).requires_grad_(True)
                (grad,) = torch.autograd.grad(critic(points).sum(), points, create_graph=True)
                loss_c = loss_c + ((grad.norm(dim=1) - 1) ** 2).mean()
            loss_c.backward()
            opt_c.step()
        if iteration >= args.generator_from:
            opt_g.zero_grad()
            loss_g = -critic(gen(torch.randn(8, 4))).mean()
            loss_g.backward()
            opt_g.step()


if __name__ == "__main__":
    main()
