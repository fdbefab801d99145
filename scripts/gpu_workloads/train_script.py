"""A plain training script, ResNet-50-sized: torchvision's ResNet-50 (random weights) trained with SGD on random
images a Dataset makes on the fly, read by DataLoader worker processes into pinned memory; argparse and the
`__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/train_script.py -- --workers 4

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (ResNet-18, 64x64 images) for a CPU run.
"""

from __future__ import annotations

import argparse
import os

import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomImages(Dataset):
    """Images and labels drawn from a generator seeded per item (the same data in every run)."""

    def __init__(self, count: int, side: int, classes: int) -> None:
        self.count, self.side, self.classes = count, side, classes

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.randn(3, self.side, self.side, generator=generator), index % self.classes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="training steps (batches) to run")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    side = 64 if small else 224
    model = (torchvision.models.resnet18() if small else torchvision.models.resnet50()).to(device)
    loader = DataLoader(RandomImages(args.steps * args.batch_size, side, 1000), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.workers, pin_memory=device == "cuda", drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for step, (images, labels) in enumerate(loader):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
