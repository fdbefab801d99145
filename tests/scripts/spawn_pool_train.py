"""A training script that prepares its data in a pool of processes started with `torch.multiprocessing.spawn`
(none of them joins a process group), then trains in its own process, with nothing of Operator Profiler in it:

    python spawn_pool_train.py --workers 2 --steps 8
    operator-profiler profile --script spawn_pool_train.py -- --workers 2

Each worker writes one shard of synthetic features and labels; the main process loads them and trains.
"""

import argparse
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch import nn


def make_shard(index: int, folder: str, rows: int) -> None:
    generator = torch.Generator().manual_seed(index)
    features = torch.randn(rows, 32, generator=generator)
    labels = (features.sum(dim=1) > 0).long()
    torch.save({"x": features, "y": labels}, Path(folder) / f"shard{index}.pt")


def train(folder: str, workers: int, steps: int) -> None:
    shards = [torch.load(Path(folder) / f"shard{k}.pt") for k in range(workers)]
    x, y = torch.cat([s["x"] for s in shards]), torch.cat([s["y"] for s in shards])
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        rows = slice((step * 16) % len(x), (step * 16) % len(x) + 16)
        loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as data:
        mp.spawn(make_shard, args=(data, 256), nprocs=options.workers, join=True)
        train(data, options.workers, options.steps)
