"""A DLRM-style recommender: sparse features through eight EmbeddingBag tables (offsets, sum), a bottom MLP over
dense features, pairwise dot-product interaction, a top MLP and a sigmoid; batch 2048 on a GPU."""
import torch
from torch import nn


class DLRM(nn.Module):
    def __init__(self, tables=8, rows=100_000, dim=64, dense=13):
        super().__init__()
        self.emb = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = nn.Sequential(nn.Linear(dense, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                    nn.Linear(256, dim), nn.ReLU())
        n = tables + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 1024), nn.ReLU(), nn.Linear(1024, 512),
                                 nn.ReLU(), nn.Linear(512, 1))

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        feats = [x] + [bag(indices[i], offsets[i]) for i, bag in enumerate(self.emb)]
        z = torch.stack(feats, dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))
        flat = inter[:, self.pairs[0], self.pairs[1]]
        return torch.sigmoid(self.top(torch.cat([x, flat], dim=1)))


def get_model_and_input():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batch = 2048 if device.type == "cuda" else 256
    g = torch.Generator().manual_seed(0)
    model = DLRM().to(device).eval()
    model.pairs = model.pairs.to(device)
    dense = torch.randn(batch, 13, generator=g).to(device)
    lengths = torch.randint(1, 20, (8, batch), generator=g)
    indices = torch.stack([torch.randint(0, 100_000, (int(lengths.sum(1).max()),), generator=g)
                           for _ in range(8)]).to(device)
    offsets = torch.cat([torch.zeros(8, 1, dtype=torch.long), lengths.cumsum(1)[:, :-1]], dim=1).to(device)
    return model, (dense, indices, offsets)
