"""A DistributedDataParallel training script that starts its own ranks with `torch.multiprocessing.spawn`, as
PyTorch's first DDP tutorial does, with nothing of Operator Profiler in it:

    python spawn_train.py --ranks 2
    operator-profiler profile --script spawn_train.py -- --ranks 2

Each spawned process is told its rank by its index, meets its peers at MASTER_ADDR:MASTER_PORT (set here, as the
tutorial does) and trains its DDP model.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, world_size: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(args.port)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = ddp(torch.randn(16, 32, device=device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--port", type=int, default=12355)
    options = parser.parse_args()
    mp.spawn(worker, args=(options.ranks, options), nprocs=options.ranks, join=True)
