"""A plain serving script whose model is TorchScript: a small ResNet-style classifier compiled with
`torch.jit.script` (as older deployment code still is), then served batch after batch under `torch.inference_mode()`.
TorchScript runs the model's forward in its own interpreter: Python's module hooks never see the submodules' calls.
argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/torchscript_serve.py --window-fn serve

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

SIZES = {"gpu": {"batch": 64, "image": 128, "width": 64, "calls": 40},
         "small": {"batch": 2, "image": 32, "width": 8, "calls": 12}}


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class Classifier(nn.Module):
    """A stem, four residual blocks at two resolutions, pooling and a linear head."""

    def __init__(self, width: int, classes: int = 100) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        self.stage1 = nn.Sequential(Block(width), Block(width))
        self.down = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.stage2 = nn.Sequential(Block(2 * width), Block(2 * width))
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def serve(model: torch.jit.ScriptModule, batch: torch.Tensor) -> list[int]:
    """Classify one batch; the labels go back to the host."""
    with torch.inference_mode():
        return model(batch).argmax(dim=1).tolist()


def main() -> None:
    """Serve the given number of batches and print how many labels came back."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=sizes["calls"])
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.jit.script(Classifier(sizes["width"]).to(device).eval())
    labels = 0
    for _ in range(args.calls):
        labels += len(serve(model, torch.randn(sizes["batch"], 3, sizes["image"], sizes["image"], device=device)))
    print(f"{labels} labels")


if __name__ == "__main__":
    main()
