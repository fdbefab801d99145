"""A plain serving script for a packed-sequence encoder: each batch packs documents of random lengths into rows of
2,048 tokens, and attention stays within each document through FlexAttention (`flex_attention` with a `BlockMask`
built by `create_block_mask` per batch, compiled by the script itself as FlexAttention's documentation says), under
bfloat16 autocast. argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/flex_serve.py --window-fn serve

Without CUDA the attention runs uncompiled. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

SIZES = {"gpu": {"width": 512, "heads": 8, "depth": 4, "seq": 2048, "batch": 4},
         "small": {"width": 32, "heads": 2, "depth": 1, "seq": 128, "batch": 1}}


class Block(nn.Module):
    def __init__(self, width: int, heads: int, attend: object) -> None:
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v, block_mask=mask)  # type: ignore[operator]
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class PackedEncoder(nn.Module):
    def __init__(self, width: int, heads: int, depth: int, attend: object) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)


def document_ids(batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """Each row cut into documents of 64 to 1,024 tokens: the document number of every token."""
    rows = []
    for _ in range(batch):
        cuts = torch.randint(64, max(65, seq // 2), (seq // 64,), generator=generator).cumsum(0)
        rows.append(torch.bucketize(torch.arange(seq), cuts[cuts < seq], right=True))
    return torch.stack(rows)


def serve(model: PackedEncoder, x: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """One packed batch: its block mask, then the encoder."""
    def same_document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return docs[b, q] == docs[b, k]

    mask = create_block_mask(same_document, docs.shape[0], None, docs.shape[1], docs.shape[1], device=str(x.device))
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return model(x, mask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    attend = torch.compile(flex_attention) if device == "cuda" else flex_attention
    torch.manual_seed(0)
    model = PackedEncoder(sizes["width"], sizes["heads"], sizes["depth"], attend).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for index in range(args.batches):
            docs = document_ids(sizes["batch"], sizes["seq"], generator).to(device)
            x = torch.randn(sizes["batch"], sizes["seq"], sizes["width"], device=device)
            out = serve(model, x, docs)
            if index % 4 == 0:
                print(f"batch {index}: {int(docs.max()) + 1} documents in the last row, mean {out.float().mean():.4f}")
    if device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
