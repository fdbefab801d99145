"""A plain training script for a neural vocoder in the style of HiFi-GAN's generator: mel frames in, a waveform out,
through transposed 1-D convolutions that upsample and dilated residual convolutions, every convolution under
`torch.nn.utils.parametrizations.weight_norm` (its weight recomputed from `original0`/`original1` at each call). The
loss is an L1 on the waveform plus a multi-resolution STFT loss (`torch.stft`, cuFFT); bfloat16 autocast, gradient
clipping, AdamW with a learning-rate schedule, and an exponential moving average of the weights
(`torch.optim.swa_utils.AveragedModel`) updated after every step. argparse, a DataLoader and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/vocoder_ema_train.py

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"mels": 80, "frames": 64, "width": 256, "batch": 8, "examples": 96},
         "small": {"mels": 8, "frames": 8, "width": 8, "batch": 2, "examples": 12}}
UPSAMPLE = (8, 8)  # the waveform has 64 samples a frame
FFTS = (128, 256, 512)


class ResBlock(nn.Module):
    """Dilated convolutions, each added to its input after a leaky ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(weight_norm(nn.Conv1d(channels, channels, 3, dilation=d, padding=d))
                                   for d in (1, 3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(nn.functional.leaky_relu(x, 0.1))
        return x


class Generator(nn.Module):
    """Mel frames (n, mels, t) -> waveform (n, 1, t * 64)."""

    def __init__(self, mels: int, width: int) -> None:
        super().__init__()
        self.pre = weight_norm(nn.Conv1d(mels, width, 7, padding=3))
        self.ups = nn.ModuleList()
        self.blocks = nn.ModuleList()
        channels = width
        for factor in UPSAMPLE:
            self.ups.append(weight_norm(nn.ConvTranspose1d(channels, channels // 2, 2 * factor, stride=factor,
                                                           padding=factor // 2)))
            channels //= 2
            self.blocks.append(ResBlock(channels))
        self.post = weight_norm(nn.Conv1d(channels, 1, 7, padding=3))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.pre(mel)
        for up, block in zip(self.ups, self.blocks, strict=True):
            x = block(up(nn.functional.leaky_relu(x, 0.1)))
        return torch.tanh(self.post(nn.functional.leaky_relu(x, 0.1)))


def stft_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-resolution STFT magnitude loss (float32: cuFFT has no bfloat16)."""
    loss = predicted.new_zeros(())
    for n_fft in FFTS:
        window = torch.hann_window(n_fft, device=predicted.device)
        spectra = [torch.stft(w.float().squeeze(1), n_fft, n_fft // 4, window=window, return_complex=True).abs()
                   for w in (predicted, target)]
        loss = loss + nn.functional.l1_loss(spectra[0].clamp_min(1e-5).log(), spectra[1].clamp_min(1e-5).log())
    return loss


def main() -> None:
    """Train `--epochs` epochs of mel/waveform pairs."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-4)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Generator(sizes["mels"], sizes["width"]).to(device)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.8, 0.99))
    schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.999)
    mels = torch.randn(sizes["examples"], sizes["mels"], sizes["frames"])
    waves = torch.rand(sizes["examples"], 1, sizes["frames"] * 64) * 2 - 1
    loader = DataLoader(TensorDataset(mels, waves), batch_size=sizes["batch"], shuffle=True, drop_last=True,
                        num_workers=2, pin_memory=device == "cuda")
    for epoch in range(args.epochs):
        for mel, wave in loader:
            mel, wave = mel.to(device, non_blocking=True), wave.to(device, non_blocking=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                predicted = model(mel)
            loss = nn.functional.l1_loss(predicted.float(), wave) + stft_loss(predicted, wave)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            ema.update_parameters(model)
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
