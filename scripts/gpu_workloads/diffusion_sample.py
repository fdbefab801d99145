"""A plain sampling script for a diffusion model: a small U-Net (residual convolution blocks, self-attention at the
lowest resolution, a sinusoidal time embedding) denoised over DDIM steps with classifier-free guidance (the
conditional and unconditional halves in one batch each step). Random weights: the work, not the images, is the
point. argparse and the `__main__` guard; nothing of Operator Profiler in it. Its steps are calls of `sample`:

    operator-profiler run --script scripts/gpu_workloads/diffusion_sample.py --window-fn sample --steps 1:1

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {"gpu": {"batch": 8, "image": 64, "width": 96, "steps": 25, "classes": 10, "calls": 10},
         "small": {"batch": 1, "image": 16, "width": 8, "steps": 3, "classes": 4, "calls": 10}}


class ResBlock(nn.Module):
    """GroupNorm, SiLU, a 3x3 convolution, the time embedding added, again, and a residual."""

    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.time = nn.Linear(tdim, cout)
        self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class Attention(nn.Module):
    """Self-attention over the pixels of a feature map."""

    def __init__(self, channels: int, heads: int = 4) -> None:
        super().__init__()
        self.norm, self.heads = nn.GroupNorm(8, channels), heads
        self.qkv, self.out = nn.Conv2d(channels, 3 * channels, 1), nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).transpose(-1, -2).unbind(1)
        y = F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(b, c, h, w)
        return x + self.out(y)


class UNet(nn.Module):
    """Two resolutions down, attention in the middle, two up with skips; a class embedding for guidance."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        tdim = 4 * width
        self.width = width
        self.time = nn.Sequential(nn.Linear(width, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.label = nn.Embedding(classes + 1, tdim)  # the last id: no class (the unconditional half)
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.down1, self.down2 = ResBlock(width, width, tdim), ResBlock(width, 2 * width, tdim)
        self.mid, self.attn = ResBlock(2 * width, 2 * width, tdim), Attention(2 * width)
        self.up2, self.up1 = ResBlock(4 * width, width, tdim), ResBlock(2 * width, width, tdim)
        self.head = nn.Sequential(nn.GroupNorm(8, width), nn.SiLU(), nn.Conv2d(width, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        half = self.width // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / half)
        emb = self.time(torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], 1))
        emb = emb + self.label(label)
        h1 = self.down1(self.stem(x), emb)
        h2 = self.down2(F.avg_pool2d(h1, 2), emb)
        m = self.attn(self.mid(F.avg_pool2d(h2, 2), emb))
        u2 = self.up2(torch.cat([F.interpolate(m, scale_factor=2.0), h2], 1), emb)
        u1 = self.up1(torch.cat([F.interpolate(u2, scale_factor=2.0), h1], 1), emb)
        return self.head(u1)


@torch.no_grad()
def sample(model: UNet, labels: torch.Tensor, image: int, steps: int, guidance: float = 3.0) -> torch.Tensor:
    """DDIM sampling (eta 0) over `steps` of a cosine schedule, with classifier-free guidance."""
    n = labels.shape[0]
    x = torch.randn(n, 3, image, image, device=labels.device)
    times = torch.linspace(0.999, 0.0, steps + 1, device=labels.device)
    alpha = torch.cos(times * math.pi / 2) ** 2
    both = torch.cat([labels, torch.full_like(labels, model.label.num_embeddings - 1)])
    for i in range(steps):
        eps_cond, eps_free = model(torch.cat([x, x]), (times[i] * 1000).expand(2 * n), both).chunk(2)
        eps = eps_free + guidance * (eps_cond - eps_free)
        x0 = (x - (1 - alpha[i]).sqrt() * eps) / alpha[i].sqrt()
        x = alpha[i + 1].sqrt() * x0 + (1 - alpha[i + 1]).sqrt() * eps
    return x.clamp(-1, 1)


def main() -> None:
    """Draw the given number of batches and print their mean."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=sizes["calls"])
    parser.add_argument("--steps", type=int, default=sizes["steps"])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = UNet(sizes["width"], sizes["classes"]).to(device).eval()
    for call in range(args.calls):
        labels = torch.randint(0, sizes["classes"], (sizes["batch"],), device=device)
        images = sample(model, labels, sizes["image"], args.steps)
        print(f"batch {call}: mean {images.mean().item():+.3f}")


if __name__ == "__main__":
    main()
