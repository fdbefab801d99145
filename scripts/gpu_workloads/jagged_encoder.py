"""A plain serving script that encodes variable-length documents without padding: each batch is one nested tensor of
the jagged layout (`torch.nested.nested_tensor(..., layout=torch.jagged)`), run through pre-norm transformer blocks
whose attention is `scaled_dot_product_attention` on the jagged tensors, then mean-pooled per document. argparse and
the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/jagged_encoder.py --window-fn encode --steps 2:2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

SIZES = {"gpu": {"dim": 512, "heads": 8, "layers": 4, "docs": 32, "min_len": 16, "max_len": 512},
         "small": {"dim": 16, "heads": 2, "layers": 2, "docs": 3, "min_len": 2, "max_len": 8}}


class Block(nn.Module):
    """Pre-norm attention and MLP over jagged (docs, j, dim) tensors."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(self.attend(q, k, v) if x.is_cuda else self.attend_each(q, k, v))
        return x + self.mlp(self.norm2(x))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """SDPA on the jagged tensors: (docs, j, heads, head_dim) -> (docs, heads, j, head_dim) and back."""
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)

    def attend_each(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The same a document at a time: no CPU kernel takes jagged tensors."""
        out = []
        for a, b, c in zip(q.unbind(), k.unbind(), v.unbind(), strict=True):
            a, b, c = (t.unflatten(-1, (self.heads, -1)).transpose(0, 1) for t in (a, b, c))
            out.append(F.scaled_dot_product_attention(a, b, c).transpose(0, 1).flatten(-2))
        return torch.nested.nested_tensor_from_jagged(torch.cat(out), offsets=q.offsets())


class Encoder(nn.Module):
    """Jagged token embeddings -> one vector per document."""

    def __init__(self, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.norm(x).mean(dim=1)


def make_batch(docs: int, min_len: int, max_len: int, dim: int, device: str, dtype: torch.dtype) -> torch.Tensor:
    """`docs` documents of random lengths as one jagged nested tensor."""
    lengths = torch.randint(min_len, max_len + 1, (docs,)).tolist()
    return torch.nested.nested_tensor([torch.randn(n, dim) for n in lengths], layout=torch.jagged, device=device,
                                      dtype=dtype)


@torch.inference_mode()
def encode(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """One batch's document vectors, on the host."""
    return model(batch).float().cpu()


def main() -> None:
    """Encode `--batches` batches of random documents."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = Encoder(sizes["dim"], sizes["heads"], sizes["layers"]).to(device, dtype).eval()
    for index in range(args.batches):
        batch = make_batch(sizes["docs"], sizes["min_len"], sizes["max_len"], sizes["dim"], device, dtype)
        vectors = encode(model, batch)
        print(f"batch {index}: {tuple(vectors.shape)}")


if __name__ == "__main__":
    main()
