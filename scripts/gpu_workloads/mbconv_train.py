"""A plain training script for mbconv_net.py's EfficientNet-B0-shaped network (imported from beside it, as a
project's own module): channels_last, bfloat16 autocast, SGD with Nesterov momentum and a cosine learning-rate
schedule stepped per batch, label smoothing, and an exponential moving average of the weights updated after every
optimizer step (`torch._foreach_lerp_`); batches from a DataLoader with worker processes; argparse and the
`__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/mbconv_train.py

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it (mbconv_net's small sizes) for a CPU run.
"""

from __future__ import annotations

import argparse

import torch
from mbconv_net import MBConvNet, scale
from torch import nn
from torch.utils.data import DataLoader, Dataset


class NoiseImages(Dataset):
    """Images and labels drawn from a generator seeded per item."""

    def __init__(self, count: int, side: int) -> None:
        self.count, self.side = count, side

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        return torch.rand(3, self.side, self.side, generator=generator), index % 1000


@torch.no_grad()
def update_ema(ema: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """ema <- decay * ema + (1 - decay) * params, all tensors at once."""
    torch._foreach_lerp_(ema, params, 1.0 - decay)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--side", type=int, default=192, help="image side on a GPU")
    args = parser.parse_args()
    sizes = scale()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    side = args.side if device == "cuda" else int(sizes["side"])
    torch.manual_seed(0)
    model = MBConvNet(sizes["width"]).to(device, memory_format=torch.channels_last)
    ema = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-5)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    loader = DataLoader(NoiseImages(args.steps * int(sizes["batch"]), side), batch_size=int(sizes["batch"]),
                        num_workers=args.workers, pin_memory=device == "cuda", drop_last=True)
    model.train()
    for step, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        update_ema(ema, [p.detach() for p in model.parameters()], 0.999)
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
