"""A Whisper-style audio encoder (written here, random weights): two 1-D convolutions over a log-mel spectrogram (the
second with stride 2), GELU, fixed sinusoidal positions, then `nn.TransformerEncoder` layers (pre-norm, GELU,
batch-first) and a final layer norm; 4 layers of width 384, 6 heads, 8 clips of 1,500 frames, in eval mode, under the
workload contract. In eval mode PyTorch runs each encoder layer through its fused fast path
(`aten::_transformer_encoder_layer_fwd`), one native operator per layer.
`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (2 layers of width 64, 2 clips of 64 frames)."""

from __future__ import annotations

import math
import os

import torch
from torch import nn


def sinusoids(length: int, width: int) -> torch.Tensor:
    """Whisper's fixed positions: sines then cosines over log-spaced timescales."""
    scales = torch.exp(-math.log(10000) / (width // 2 - 1) * torch.arange(width // 2))
    angle = torch.arange(length)[:, None] * scales[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=1)


class AudioEncoder(nn.Module):
    def __init__(self, mels: int, width: int, heads: int, layers: int, frames: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, width, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positions", sinusoids(frames // 2, width))
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = nn.functional.gelu(self.conv1(mel))
        x = nn.functional.gelu(self.conv2(x)).transpose(1, 2)
        return self.norm(self.blocks(x + self.positions))


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The encoder in eval mode and a batch of log-mel spectrograms, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    width, heads, layers, batch, frames = (64, 4, 2, 2, 64) if small else (384, 6, 4, 8, 3000)
    torch.manual_seed(0)
    model = AudioEncoder(80, width, heads, layers, frames).to(device).eval()
    return model, (torch.randn(batch, 80, frames, device=device),)
