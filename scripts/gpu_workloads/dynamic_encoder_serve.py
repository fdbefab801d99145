"""A plain inference script that serves a text encoder to requests of varying lengths: the encoder (pre-norm
blocks, attention through SDPA with a padding mask) is compiled with `torch.compile(dynamic=True)`, so one graph
serves every length, and each call pads its batch to a multiple of 16 tokens; the pooled embeddings are normalised
and copied back to the host per call. argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/dynamic_encoder_serve.py --window-fn serve

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU run (not compiled there).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {"gpu": {"width": 768, "heads": 12, "depth": 6, "batch": 16, "vocab": 30000, "lengths": (40, 72, 120, 200)},
         "small": {"width": 32, "heads": 2, "depth": 2, "batch": 2, "vocab": 64, "lengths": (5, 9)}}


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.ff(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(512, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x, mask)
        x = self.norm(x)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return F.normalize(pooled, dim=-1)


def padded(requests: list[torch.Tensor], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The requests as one batch padded to a multiple of 16 tokens, and its mask (True on real tokens)."""
    longest = max(len(r) for r in requests)
    width = -(-longest // 16) * 16
    tokens = torch.zeros(len(requests), width, dtype=torch.long)
    mask = torch.zeros(len(requests), width, dtype=torch.bool)
    for row, request in enumerate(requests):
        tokens[row, : len(request)], mask[row, : len(request)] = request, True
    return tokens.to(device, non_blocking=True), mask.to(device, non_blocking=True)


@torch.inference_mode()
def serve(encoder: nn.Module, requests: list[torch.Tensor], device: str) -> torch.Tensor:
    """One batch of requests in, their embeddings on the host out."""
    tokens, mask = padded(requests, device)
    return encoder(tokens, mask).cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=12)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    torch.manual_seed(0)
    encoder = Encoder(sizes["vocab"], sizes["width"], sizes["heads"], sizes["depth"]).to(device).eval()
    if device == "cuda":
        encoder = torch.compile(encoder, dynamic=True)
    generator = torch.Generator().manual_seed(0)
    lengths = sizes["lengths"]
    for call in range(args.calls):
        longest = lengths[call % len(lengths)]
        requests = [torch.randint(1, sizes["vocab"], (int(torch.randint(longest // 2, longest + 1, (1,),
                                                                            generator=generator)),),
                                  generator=generator) for _ in range(sizes["batch"])]
        embeddings = serve(encoder, requests, device)
        print(f"call {call}: {embeddings.shape[0]} requests, longest {max(len(r) for r in requests)} tokens")


if __name__ == "__main__":
    main()
