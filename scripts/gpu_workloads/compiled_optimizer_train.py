"""A plain training script that compiles its optimizer's step as PyTorch's "compiled optimizer" tutorial does: the model
under `torch.compile`, and `optimizer.step()` inside a function of its own under `torch.compile` too, with the learning
rate a tensor (so a scheduler changing it does not recompile the step) and a cosine schedule. The model is a
convolutional classifier (residual blocks, BatchNorm, SiLU); a DataLoader feeds it. argparse and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/compiled_optimizer_train.py --steps 3:2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"width": 64, "blocks": 4, "image": 64, "batch": 64, "examples": 640, "classes": 100},
         "small": {"width": 4, "blocks": 1, "image": 8, "batch": 2, "examples": 8, "classes": 3}}


class Residual(nn.Module):
    """Two 3x3 convolutions with BatchNorm and SiLU, added to the input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.SiLU(),
                                  nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(x + self.body(x))


class Net(nn.Module):
    """Images (n, 3, s, s) -> logits (n, classes)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        width = sizes["width"]
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.SiLU())
        self.blocks = nn.Sequential(*(Residual(width) for _ in range(sizes["blocks"])))
        self.head = nn.Linear(width, sizes["classes"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def main() -> None:
    """Train `--epochs` epochs of random images."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = torch.compile(Net(sizes).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(args.lr), weight_decay=0.05)
    steps = args.epochs * (sizes["examples"] // sizes["batch"])
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    @torch.compile(fullgraph=False)
    def update() -> None:
        optimizer.step()

    images = torch.randn(sizes["examples"], 3, sizes["image"], sizes["image"])
    labels = torch.randint(0, sizes["classes"], (sizes["examples"],))
    loader = DataLoader(TensorDataset(images, labels), batch_size=sizes["batch"], shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    for epoch in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
