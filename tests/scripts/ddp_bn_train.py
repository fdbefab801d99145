"""A DistributedDataParallel training script whose model holds BatchNorm buffers, for torchrun, with nothing of
Operator Profiler in it:

    torchrun --nproc-per-node 2 ddp_bn_train.py --steps 6
    operator-profiler profile --script ddp_bn_train.py --nproc-per-node 2 -- --steps 6

DDP broadcasts rank 0's buffers at every forward and all-reduces the gradients from its reducer's hooks in the
backward: work no line of the script calls by itself.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 14 * 14, 4))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = ddp(torch.randn(4, 3, 16, 16)).square().mean()  # FORWARD
        optimizer.zero_grad()
        loss.backward()  # BACKWARD
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
