"""Two Swin-style blocks (shifted-window attention: torch.roll, window partition by view/permute, relative position
bias) trained one AdamW step on 8 images' 56x56 patch grid of width 96 (3 heads, windows of 7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WINDOW = 7


def partition(x: torch.Tensor) -> torch.Tensor:
    """(batch, h, w, c) as windows of WINDOW x WINDOW tokens: (batch * windows, WINDOW**2, c)."""
    b, h, w, c = x.shape
    x = x.view(b, h // WINDOW, WINDOW, w // WINDOW, WINDOW, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, WINDOW * WINDOW, c)


def merge(windows: torch.Tensor, b: int, h: int, w: int) -> torch.Tensor:
    """The windows back as (b, h, w, c)."""
    c = windows.shape[-1]
    x = windows.view(b, h // WINDOW, w // WINDOW, WINDOW, WINDOW, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, c)


class WindowBlock(nn.Module):
    """Window attention (shifted by `shift` with torch.roll) with a relative position bias, then an MLP."""

    def __init__(self, dim: int, heads: int, shift: int) -> None:
        super().__init__()
        self.heads, self.shift = heads, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(heads, (2 * WINDOW - 1) ** 2))
        coords = torch.stack(torch.meshgrid(torch.arange(WINDOW), torch.arange(WINDOW), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + WINDOW - 1
        self.register_buffer("index", rel[..., 0] * (2 * WINDOW - 1) + rel[..., 1], persistent=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output for `x` (b, h, w, c)."""
        b, h, w, c = x.shape
        y = self.norm1(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), (1, 2))
        win = partition(y)
        qkv = self.qkv(win).view(win.shape[0], -1, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1) + self.bias[:, self.index]
        out = (attn.softmax(-1) @ v).transpose(1, 2).reshape(win.shape[0], -1, c)
        y = merge(self.proj(out), b, h, w)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    """A plain and a shifted block, then a 10-way head over the mean token."""

    def __init__(self, dim: int = 96, heads: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(WindowBlock(dim, heads, 0), WindowBlock(dim, heads, WINDOW // 2))
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; `target` (the second input, for `train_step`) is not used by a forward alone."""
        return self.head(self.blocks(x).mean((1, 2)))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """The model in training mode, its AdamW attached, and (8 patch grids, 8 labels)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Swin().to(device).train()
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # type: ignore[assignment]
    return model, (torch.randn(8, 56, 56, 96, device=device), torch.randint(0, 10, (8,), device=device))


def train_step(model: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One AdamW step on the cross-entropy of the logits."""
    x, target = inputs
    optimizer = model.optimizer if hasattr(model, "optimizer") else model._orig_mod.optimizer  # type: ignore[union-attr]
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), target).backward()
    optimizer.step()
