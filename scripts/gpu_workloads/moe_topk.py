"""A mixture-of-experts stack routed top-2 of 16 experts and written to be captured: each layer's router takes the
softmax over the experts, its two largest and renormalises them; every expert runs on every token as one batched
matmul over the experts, and the outputs are combined by the sparse gate weights, so no shape depends on the data.
4 layers of width 512, experts of hidden width 1,024, 512 tokens (`small`: 2 layers of width 32, 4 experts of 64,
16 tokens). Under torch.compile, Inductor calls the top-k as aten's kernel: the router is a softmax kernel, the
top-k and a division kernel (the chain `knowledge/fx_patterns/triton_op.py` fuses)."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.nn import functional as F


class MoELayer(nn.Module):
    """Pre-norm MoE block: router, top-k softmax gates, experts as one batched matmul, a residual."""

    def __init__(self, width: int, hidden: int, experts: int, k: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.router = nn.Linear(width, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, width, hidden) * width ** -0.5)
        self.down = nn.Parameter(torch.randn(experts, hidden, width) * hidden ** -0.5)
        self.k = k

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k largest softmax weights of each token, renormalised, and their experts."""
        weights, index = torch.topk(torch.softmax(logits.float(), dim=-1), self.k, dim=-1)
        return weights / weights.sum(dim=-1, keepdim=True), index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        weights, index = self.route(self.router(h))
        gates = torch.zeros(x.shape[0], self.up.shape[0], dtype=x.dtype, device=x.device)
        gates = gates.scatter(1, index, weights.to(x.dtype))
        y = torch.bmm(F.gelu(torch.bmm(h.expand(self.up.shape[0], *h.shape), self.up)), self.down)
        return x + torch.einsum("te,etd->td", gates, y)


class MoEStack(nn.Module):
    """Layers of `MoELayer`."""

    def __init__(self, layers: int, width: int, hidden: int, experts: int, k: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(MoELayer(width, hidden, experts, k) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def get_model_and_input() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The stack in eval mode and its tokens, on the GPU when there is one."""
    small = os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small"
    layers, width, hidden, experts, tokens = (2, 32, 64, 4, 16) if small else (4, 512, 1024, 16, 512)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = MoEStack(layers, width, hidden, experts, k=2).to(device).eval()
    return model, (torch.randn(tokens, width, device=device),)
