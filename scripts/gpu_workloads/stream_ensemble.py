"""A plain serving script that runs an ensemble of two image classifiers at once: a ResNet-style CNN on one CUDA
stream and a small ViT on another, launched from the same thread so that their kernels overlap on the GPU, joined
by `wait_stream` before their logits are averaged; float16 autocast. argparse and the `__main__` guard; nothing of
Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/stream_ensemble.py --window-fn serve

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run (one stream).
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
from torch import nn

SIZES = {"gpu": {"batch": 32, "side": 224, "width": 384, "depth": 6}, "small": {"batch": 2, "side": 32, "width": 32,
                                                                              "depth": 1}}


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(channels, channels), nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = conv_bn(3, 64, 2)
        stages: list[nn.Module] = []
        for cin, cout in ((64, 64), (64, 128), (128, 256), (256, 512)):
            stages += [conv_bn(cin, cout, 2 if cin != cout else 1), Residual(cout)]
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


class ViT(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, 16, 16)
        layer = nn.TransformerEncoderLayer(width, 6 if width % 6 == 0 else 2, 4 * width, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(width, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.encoder(tokens).mean(1))


def serve(cnn: ConvNet, vit: ViT, images: torch.Tensor, streams: list[torch.cuda.Stream] | None) -> torch.Tensor:
    """Both models on the batch, each on its own stream when there are streams; their mean probabilities."""
    outputs = []
    for model, stream in zip((cnn, vit), streams or [None, None], strict=True):
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        half = torch.float16 if images.is_cuda else torch.bfloat16
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext(), \
                torch.autocast(images.device.type, dtype=half):
            outputs.append(model(images).float().softmax(-1))
    for stream, out in zip(streams or [], outputs, strict=False):
        torch.cuda.current_stream().wait_stream(stream)
        out.record_stream(torch.cuda.current_stream())
    return (outputs[0] + outputs[1]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    torch.manual_seed(0)
    cnn, vit = ConvNet().to(device).eval(), ViT(sizes["width"], sizes["depth"]).to(device).eval()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()] if device == "cuda" else None
    images = torch.randn(sizes["batch"], 3, sizes["side"], sizes["side"], device=device)
    with torch.inference_mode():
        for index in range(args.batches):
            probabilities = serve(cnn, vit, images, streams)
            if index % 5 == 0:
                print(f"batch {index}: top class {int(probabilities[0].argmax())}")


if __name__ == "__main__":
    main()
