"""A plain GAN training script: a DCGAN-style generator and discriminator, each with its own Adam, trained in
turns every iteration (the discriminator on real and generated images, then the generator through the
discriminator), on random "images" from a DataLoader. argparse and the `__main__` guard; nothing of Operator
Profiler in it. `--wgan-gp` trains it as a WGAN-GP instead: Wasserstein losses, `--critic-steps` discriminator
steps per generator step, each with a gradient penalty (the norm of the critic's gradient at images between real
and fake, taken by `torch.autograd.grad(create_graph=True)` and differentiated again by the critic's backward).

    operator-profiler run --script scripts/gpu_workloads/gan_train.py
    operator-profiler run --script scripts/gpu_workloads/gan_train.py --steps 4:1 -- --wgan-gp --critic-steps 2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"latent": 128, "width": 64, "image": 64, "batch": 64, "samples": 2048},
         "small": {"latent": 16, "width": 8, "image": 16, "batch": 4, "samples": 64}}


def up(cin: int, cout: int) -> nn.Sequential:
    """A transposed convolution that doubles the size, BatchNorm and ReLU."""
    return nn.Sequential(nn.ConvTranspose2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(True))


def down(cin: int, cout: int) -> nn.Sequential:
    """A strided convolution that halves the size, BatchNorm and LeakyReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, 4, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.2, True))


class Generator(nn.Module):
    """Latent vector to image: a 4x4 seed grown by transposed convolutions."""

    def __init__(self, latent: int, width: int, image: int) -> None:
        super().__init__()
        layers = image.bit_length() - 3  # 4 -> image in doublings, the last one to RGB
        chans = [width * 2 ** (layers - 1 - i) for i in range(layers)]
        self.seed = nn.Sequential(nn.ConvTranspose2d(latent, chans[0], 4, 1, 0, bias=False),
                                  nn.BatchNorm2d(chans[0]), nn.ReLU(True))
        self.grow = nn.Sequential(*[up(a, b) for a, b in zip(chans, chans[1:], strict=False)])
        self.rgb = nn.ConvTranspose2d(chans[-1], 3, 4, 2, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.rgb(self.grow(self.seed(z[:, :, None, None]))))


class Discriminator(nn.Module):
    """Image to one logit: strided convolutions down to 4x4."""

    def __init__(self, width: int, image: int) -> None:
        super().__init__()
        layers = image.bit_length() - 3  # image -> 4 in halvings, the first one from RGB
        chans = [width * 2 ** i for i in range(layers)]
        self.stem = nn.Sequential(nn.Conv2d(3, chans[0], 4, 2, 1), nn.LeakyReLU(0.2, True))
        self.body = nn.Sequential(*[down(a, b) for a, b in zip(chans, chans[1:], strict=False)])
        self.logit = nn.Conv2d(chans[-1], 1, 4, 1, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logit(self.body(self.stem(x))).flatten()


def gradient_penalty(disc: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """WGAN-GP's penalty: (||grad D(x)|| - 1)^2 at random points between real and fake images."""
    mix = torch.rand(real.shape[0], 1, 1, 1, device=real.device)
    points = (mix * real + (1 - mix) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(disc(points).sum(), points, create_graph=True)
    return ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()


def main() -> None:
    """Train both networks for the given epochs and print the losses."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=sizes["samples"])
    parser.add_argument("--batch", type=int, default=sizes["batch"])
    parser.add_argument("--wgan-gp", action="store_true", help="Wasserstein losses with a gradient penalty")
    parser.add_argument("--critic-steps", type=int, default=1, help="discriminator steps per generator step")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    images = torch.rand(args.samples, 3, sizes["image"], sizes["image"]) * 2 - 1
    loader = DataLoader(TensorDataset(images), batch_size=args.batch, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    gen = Generator(sizes["latent"], sizes["width"], sizes["image"]).to(device)
    disc = Discriminator(sizes["width"], sizes["image"]).to(device)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    seen = 0
    for epoch in range(args.epochs):
        for (real,) in loader:
            real = real.to(device, non_blocking=True)
            ones = torch.ones(real.shape[0], device=device)
            zeros = torch.zeros(real.shape[0], device=device)
            fake = gen(torch.randn(real.shape[0], sizes["latent"], device=device))
            opt_d.zero_grad(set_to_none=True)
            if args.wgan_gp:
                loss_d = (disc(fake.detach()).mean() - disc(real).mean()
                          + 10.0 * gradient_penalty(disc, real, fake.detach()))
            else:
                loss_d = criterion(disc(real), ones) + criterion(disc(fake.detach()), zeros)
            loss_d.backward()
            opt_d.step()
            seen += 1
            if seen % args.critic_steps:
                continue
            opt_g.zero_grad(set_to_none=True)
            loss_g = -disc(fake).mean() if args.wgan_gp else criterion(disc(fake), ones)
            loss_g.backward()
            opt_g.step()
        print(f"epoch {epoch}: discriminator {loss_d.item():.3f}, generator {loss_g.item():.3f}")


if __name__ == "__main__":
    main()
