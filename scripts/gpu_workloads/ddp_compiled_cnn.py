"""An image classifier's data-parallel training script as people write it for speed, launched by torchrun, with
nothing of Operator Profiler in it:

    torchrun --nproc-per-node 2 ddp_compiled_cnn.py --steps 40
    operator-profiler run --script ddp_compiled_cnn.py --nproc-per-node 2 -- --steps 40

Each rank wraps a small ResNet-style network (channels_last) in DDP, compiles the wrapped model with
`torch.compile` (Dynamo's DDP optimizer splits the graph at the gradient buckets, so each bucket's all-reduce can
start while the backward goes on), trains it under fp16 autocast with a `GradScaler` (`scaler.step(optimizer)`),
and steps a OneCycle learning-rate schedule. `--small` (or OPERATOR_PROFILER_EXAMPLE_SCALE=small) shrinks it for a
CPU machine (gloo, no autocast).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def block(cin: int, cout: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Net(nn.Module):
    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.stages = nn.Sequential(block(width, width, 1), block(width, 2 * width, 2), block(2 * width, 4 * width, 2))
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def main(args: argparse.Namespace) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    small = args.small or os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    width, batch, size = (32, 4, 16) if small else (64, 64, 64)
    model = Net(width, 100).to(device).to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None, bucket_cap_mb=args.bucket_mb)
    forward = torch.compile(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.4, total_steps=args.steps)
    scaler = torch.amp.GradScaler(device.type, enabled=cuda)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    for step in range(args.steps):
        images = torch.randn(batch, 3, size, size, device=device, generator=generator)
        images = images.contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 100, (batch,), device=device, generator=generator)
        with torch.autocast(device.type, dtype=torch.float16, enabled=cuda):
            loss = loss_fn(forward(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        schedule.step()
        if dist.get_rank() == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's gradient bucket size (MB)")
    parser.add_argument("--small", action="store_true", help="a model small enough for a CPU machine")
    main(parser.parse_args())
