"""A diffusion transformer's denoiser (DiT-S/2 style): a 4x32x32 latent cut into 2x2 patches (256 tokens of width 384),
a sinusoidal timestep embedding and a class embedding summed into a conditioning vector, 6 blocks whose LayerNorms
are modulated by it (adaLN-Zero: shift, scale and gate from one linear layer per block), and a modulated final layer
that turns the tokens back into a latent (noise and variance). 16 latents in eval mode, their timesteps and labels as
integer tensors (`small`: 2 blocks of width 64 on 2 latents of 4x8x8): a generative model none of the others is."""

from __future__ import annotations

import math
import os

import torch
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x * (1 + scale) + shift, one shift and scale per sample broadcast over the tokens."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedding(nn.Module):
    """Sinusoidal frequencies of the timestep through a two-layer MLP."""

    def __init__(self, width: int, frequencies: int = 256) -> None:
        super().__init__()
        self.frequencies = frequencies
        self.mlp = nn.Sequential(nn.Linear(frequencies, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequencies // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1))


class DiTBlock(nn.Module):
    """Self-attention and MLP, each after a LayerNorm without affine that the conditioning shifts and scales, each
    residual gated by it."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).chunk(6, dim=-1)
        b, n, d = x.shape
        h = modulate(self.norm1(x), shift1, scale1)
        q, k, v = self.qkv(h).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + gate1.unsqueeze(1) * self.proj(attn)
        return x + gate2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift2, scale2))


class DiT(nn.Module):
    """Patchify, positions, conditioning, the blocks, the modulated final layer and unpatchify."""

    def __init__(self, side: int, width: int, heads: int, depth: int, classes: int = 1000, patch: int = 2) -> None:
        super().__init__()
        self.side, self.patch, self.out_channels = side, patch, 8
        self.patchify = nn.Conv2d(4, width, patch, stride=patch)
        self.positions = nn.Parameter(torch.randn(1, (side // patch) ** 2, width) * 0.02)
        self.timestep = TimestepEmbedding(width)
        self.labels = nn.Embedding(classes + 1, width)  # the last row: no class (classifier-free guidance)
        self.blocks = nn.ModuleList(DiTBlock(width, heads) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.final = nn.Linear(width, patch * patch * self.out_channels)

    def forward(self, latents: torch.Tensor, t: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.patchify(latents).flatten(2).transpose(1, 2) + self.positions
        c = self.timestep(t) + self.labels(labels)
        for block in self.blocks:
            x = block(x, c)
        shift, scale = self.final_ada(c).chunk(2, dim=-1)
        x = self.final(modulate(self.final_norm(x), shift, scale))
        b, grid, p = len(x), self.side // self.patch, self.patch
        x = x.view(b, grid, grid, p, p, self.out_channels).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(b, self.out_channels, self.side, self.side)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The model in eval mode, and (latents, timesteps, class labels), on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch, side, width, heads, depth = (2, 8, 64, 4, 2) if small else (16, 32, 384, 6, 6)
    torch.manual_seed(0)
    model = DiT(side, width, heads, depth).to(device).eval()
    latents = torch.randn(batch, 4, side, side, device=device)
    t = torch.randint(0, 1000, (batch,), device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    return model, (latents, t, labels)
