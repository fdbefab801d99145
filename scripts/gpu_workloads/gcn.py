"""A 3-layer graph convolutional network over a fixed random graph (100,000 nodes, 1,000,000 edges on a GPU):
messages gathered along edges, scaled by degree and summed into nodes with index_add_."""
import torch
from torch import nn


class GCNLayer(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, x, src, dst, norm):
        h = self.lin(x)
        msg = h[src] * norm.unsqueeze(1)
        return torch.zeros_like(h).index_add_(0, dst, msg)


class GCN(nn.Module):
    def __init__(self, d_in=128, hidden=256, classes=40):
        super().__init__()
        self.layers = nn.ModuleList([GCNLayer(d_in, hidden), GCNLayer(hidden, hidden), GCNLayer(hidden, classes)])

    def forward(self, x, src, dst, norm):
        for i, layer in enumerate(self.layers):
            x = layer(x, src, dst, norm)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x.log_softmax(-1)


def get_model_and_input():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    nodes, edges = (100_000, 1_000_000) if device.type == "cuda" else (5_000, 50_000)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    deg = torch.bincount(dst, minlength=nodes).clamp(min=1).float()
    norm = deg[dst].rsqrt() * deg[src].rsqrt()
    x = torch.randn(nodes, 128, generator=g)
    model = GCN().to(device).eval()
    return model, tuple(t.to(device) for t in (x, src, dst, norm))
