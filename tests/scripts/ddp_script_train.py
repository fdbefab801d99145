"""A DistributedDataParallel training script as PyTorch's tutorial writes it for torchrun, with nothing of Operator
Profiler in it:

    torchrun --nproc-per-node 2 ddp_script_train.py --steps 8
    operator-profiler profile --script ddp_script_train.py --nproc-per-node 2 -- --steps 8

Each rank joins the process group from torchrun's environment, wraps its model in DDP and trains on its own batches.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def train(args: argparse.Namespace) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(16, 32, device=device, generator=generator)
        loss = ddp(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    train(parser.parse_args())
