"""A Fourier neural operator: spectral convolutions (rfft2, complex weights on the lowest modes, irfft2) beside 1x1
convolutions, GELU between, on a batch of 2-D fields."""

from __future__ import annotations

import os

import torch
from torch import nn


class SpectralConv(nn.Module):
    """Multiply the lowest `modes` Fourier modes by complex weights."""

    def __init__(self, width: int, modes: int) -> None:
        super().__init__()
        scale = 1.0 / (width * width)
        self.modes = modes
        self.w1 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat))
        self.w2 = nn.Parameter(scale * torch.randn(width, width, modes, modes, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        xf = torch.fft.rfft2(x)
        out = torch.zeros(b, c, h, w // 2 + 1, dtype=torch.cfloat, device=x.device)
        m = self.modes
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.w1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -m:, :m], self.w2)
        return torch.fft.irfft2(out, s=(h, w))


class FNO(nn.Module):
    """Lift, four Fourier layers, project."""

    def __init__(self, width: int, modes: int, layers: int = 4) -> None:
        super().__init__()
        self.lift = nn.Conv2d(3, width, 1)
        self.spectral = nn.ModuleList(SpectralConv(width, modes) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv2d(width, width, 1) for _ in range(layers))
        self.project = nn.Sequential(nn.Conv2d(width, 128, 1), nn.GELU(), nn.Conv2d(128, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lift(x)
        for spectral, pointwise in zip(self.spectral, self.pointwise, strict=True):
            x = nn.functional.gelu(spectral(x) + pointwise(x))
        return self.project(x)


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval) and a batch of fields: 16 of 3x128x128 on a GPU, 2 of 3x32x32 on a CPU."""
    small = os.environ.get("OPERATOR_PROFILER_SMALL") == "1" or not torch.cuda.is_available()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch, side, width, modes = (2, 32, 16, 8) if small else (16, 128, 64, 16)
    model = FNO(width, modes).to(device).eval()
    return model, (torch.randn(batch, 3, side, side, device=device),)
