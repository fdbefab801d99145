"""A plain training script for a convolutional variational autoencoder (written here): an encoder of strided
convolutions to a mean and log-variance, the reparameterisation trick, a decoder of transposed convolutions; the loss
is binary cross-entropy on the pixels plus the KL term; float16 autocast with a GradScaler, gradient accumulation over
2 micro-batches, Adam; images from a DataLoader; argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/vae_train.py

`--cudnn-benchmark` turns cuDNN's autotuner on (`torch.backends.cudnn.benchmark`); `--time` prints the milliseconds
per optimizer step after the first third of the steps (CUDA-synchronised wall time).
`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (32x32 images, 8 per micro-batch) for a CPU run.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ConvVAE(nn.Module):
    """Images (batch, 3, side, side) in [0, 1] -> reconstruction logits, mean, log-variance."""

    def __init__(self, side: int, latent: int) -> None:
        super().__init__()
        widths = [3, 32, 64, 128, 256]
        down: list[nn.Module] = []
        for width_in, width_out in zip(widths, widths[1:], strict=False):
            down += [nn.Conv2d(width_in, width_out, 4, stride=2, padding=1), nn.BatchNorm2d(width_out),
                     nn.LeakyReLU(0.2)]
        self.encoder = nn.Sequential(*down, nn.Flatten())
        self.cells = side // 16
        flat = 256 * self.cells * self.cells
        self.mean = nn.Linear(flat, latent)
        self.log_var = nn.Linear(flat, latent)
        self.expand = nn.Linear(latent, flat)
        up: list[nn.Module] = []
        for width_in, width_out in zip(widths[:0:-1], widths[-2::-1], strict=False):
            up.append(nn.ConvTranspose2d(width_in, width_out, 4, stride=2, padding=1))
            if width_out != 3:
                up += [nn.BatchNorm2d(width_out), nn.ReLU()]
        self.decoder = nn.Sequential(*up)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.encoder(images)
        mean, log_var = self.mean(features), self.log_var(features)
        latent = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        grid = self.expand(latent).view(-1, 256, self.cells, self.cells)
        return self.decoder(grid), mean, log_var


def vae_loss(logits: torch.Tensor, images: torch.Tensor, mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """Reconstruction (binary cross-entropy summed over pixels) plus KL divergence, averaged over the batch."""
    reconstruction = nn.functional.binary_cross_entropy_with_logits(logits.float(), images, reduction="sum")
    kl = -0.5 * torch.sum(1 + log_var.float() - mean.float() ** 2 - log_var.float().exp())
    return (reconstruction + kl) / images.shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="images per micro-batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps to run")
    parser.add_argument("--latent", type=int, default=128)
    parser.add_argument("--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape")
    parser.add_argument("--time", action="store_true", help="print ms per step after the first third of the steps")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    side, batch = (32, 8) if small else (128, args.batch_size)
    torch.manual_seed(0)
    model = ConvVAE(side, args.latent).to(device)
    images = torch.rand(args.steps * args.accumulate * batch, 3, side, side)
    loader = DataLoader(TensorDataset(images), batch_size=batch, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    model.train()
    timed_from, started = args.steps // 3, 0.0
    for micro, (batch_images,) in enumerate(loader):
        if args.time and micro == timed_from * args.accumulate:
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
        batch_images = batch_images.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.float16, enabled=device == "cuda"):
            logits, mean, log_var = model(batch_images)
        loss = vae_loss(logits, batch_images, mean, log_var) / args.accumulate
        scaler.scale(loss).backward()
        if (micro + 1) % args.accumulate == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    if args.time:
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"ms per step {1e3 * (time.perf_counter() - started) / (args.steps - timed_from):.3f}")
    print(f"last loss {args.accumulate * loss.item():.1f}")


if __name__ == "__main__":
    main()
