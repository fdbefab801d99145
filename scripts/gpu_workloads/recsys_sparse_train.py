"""A plain recommender training script: bags of categorical ids embedded by `nn.EmbeddingBag(sparse=True)` tables
(their gradients sparse, updated by `SparseAdam`), dense features through an MLP, a dot-product interaction and a
click-through head (updated by `Adam`): two optimizers over one model, stepped one after the other. A DataLoader
yields variable-length id bags as flat ids and offsets. argparse and the `__main__` guard; nothing of Operator
Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/recsys_sparse_train.py

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SIZES = {"gpu": {"tables": 8, "rows": 200_000, "dim": 64, "dense": 13, "bag": 20, "batch": 2048, "samples": 65536},
         "small": {"tables": 3, "rows": 100, "dim": 8, "dense": 4, "bag": 3, "batch": 8, "samples": 64}}


class Clicks(Dataset):
    """Random samples: dense features, one bag of ids per table (1 to 2*bag ids), a click label."""

    def __init__(self, count: int, sizes: dict[str, int]) -> None:
        gen = torch.Generator().manual_seed(0)
        self.sizes = sizes
        self.dense = torch.randn(count, sizes["dense"], generator=gen)
        self.lengths = torch.randint(1, 2 * sizes["bag"], (count, sizes["tables"]), generator=gen)
        self.label = (torch.rand(count, generator=gen) < 0.3).float()
        self.seed = 0

    def __len__(self) -> int:
        return len(self.label)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        gen = torch.Generator().manual_seed(i)
        bags = [torch.randint(0, self.sizes["rows"], (int(n),), generator=gen) for n in self.lengths[i]]
        return self.dense[i], bags, self.label[i]


def collate(batch: list[tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]]) -> dict[str, object]:
    """Dense features stacked; each table's bags as flat ids and offsets (EmbeddingBag's input)."""
    tables = len(batch[0][1])
    ids, offsets = [], []
    for t in range(tables):
        bags = [sample[1][t] for sample in batch]
        ids.append(torch.cat(bags))
        offsets.append(torch.tensor([0] + [len(b) for b in bags[:-1]]).cumsum(0))
    return {"dense": torch.stack([s[0] for s in batch]), "ids": ids, "offsets": offsets,
            "label": torch.stack([s[2] for s in batch])}


class Recommender(nn.Module):
    """Embedding bags and a dense MLP, pairwise dot products between them, a click head."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        dim = sizes["dim"]
        self.tables = nn.ModuleList(nn.EmbeddingBag(sizes["rows"], dim, mode="sum", sparse=True)
                                    for _ in range(sizes["tables"]))
        self.bottom = nn.Sequential(nn.Linear(sizes["dense"], 256), nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
        pairs = (sizes["tables"] + 1) * sizes["tables"] // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, 1))

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        features = torch.stack([x] + [table(i, o) for table, i, o in zip(self.tables, ids, offsets, strict=True)], 1)
        dots = features @ features.transpose(1, 2)
        upper = torch.triu_indices(features.shape[1], features.shape[1], offset=1, device=dense.device)
        return self.top(torch.cat([x, dots[:, upper[0], upper[1]]], dim=1)).squeeze(1)


def main() -> None:
    """Train for the given epochs and print the last loss."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    loader = DataLoader(Clicks(sizes["samples"], sizes), batch_size=sizes["batch"], shuffle=True, collate_fn=collate,
                        num_workers=args.workers, pin_memory=device == "cuda")
    model = Recommender(sizes).to(device)
    sparse = torch.optim.SparseAdam(list(model.tables.parameters()), lr=1e-3)
    dense = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    for epoch in range(args.epochs):
        for batch in loader:
            ids = [i.to(device, non_blocking=True) for i in batch["ids"]]
            offsets = [o.to(device, non_blocking=True) for o in batch["offsets"]]
            logits = model(batch["dense"].to(device, non_blocking=True), ids, offsets)
            loss = loss_fn(logits, batch["label"].to(device, non_blocking=True))
            sparse.zero_grad(set_to_none=True)
            dense.zero_grad(set_to_none=True)
            loss.backward()
            sparse.step()
            dense.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
