"""A plain training script in the style many older repositories keep: a CNN wrapped in `nn.DataParallel`, which at
every forward replicates the model onto each GPU of the process, scatters the batch and runs the replicas on a thread
each (`parallel_apply`), then gathers the outputs on the first GPU. SGD with momentum, a DataLoader of random images;
argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/dataparallel_train.py

With one GPU DataParallel calls the model as it is. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU
machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"batch": 256, "image": 64, "width": 64, "classes": 100, "examples": 256 * 30},
         "small": {"batch": 4, "image": 8, "width": 4, "classes": 3, "examples": 40}}


class Net(nn.Module):
    """Images (n, 3, h, w) -> class logits: three conv stages and a linear head."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for scale in (1, 2, 4):
            layers += [nn.Conv2d(channels, width * scale, 3, padding=1), nn.BatchNorm2d(width * scale), nn.ReLU(),
                       nn.MaxPool2d(2)]
            channels = width * scale
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


def main() -> None:
    """Train one epoch."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.DataParallel(Net(sizes["width"], sizes["classes"]).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    images = torch.randn(sizes["examples"], 3, sizes["image"], sizes["image"])
    labels = torch.randint(0, sizes["classes"], (sizes["examples"],))
    loader = DataLoader(TensorDataset(images, labels), batch_size=sizes["batch"], shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            print(f"step {step + 1}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
