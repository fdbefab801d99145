"""A plain LoRA fine-tuning script: a small decoder-only language model written here (token and position
embeddings, pre-norm blocks whose causal attention is `F.scaled_dot_product_attention`, a GELU MLP, a vocabulary
head) with every base weight frozen (`requires_grad_(False)`) and rank-8 LoRA adapters (a frozen `nn.Linear`
plus trainable A and B matrices) on the query and value projections of every block. AdamW over the adapters'
parameters only, bfloat16 autocast on CUDA, gradient accumulation of `--accum` micro-batches per optimizer step,
micro-batches of random token ids from a DataLoader. argparse and the `__main__` guard; nothing of Operator
Profiler in it. A step is one optimizer step, that is `--accum` forwards and backwards:

    operator-profiler run --script scripts/gpu_workloads/lora_finetune.py
    operator-profiler run --script scripts/gpu_workloads/lora_finetune.py --steps 3:1 -- --accum 2

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"vocab": 8192, "width": 768, "heads": 12, "depth": 6, "seq": 256, "batch": 8},
         "small": {"vocab": 128, "width": 32, "heads": 2, "depth": 2, "seq": 16, "batch": 2}}


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update: base(x) + scale * B(A(x)), B initialised to zero."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0) -> None:
        super().__init__()
        self.base = base
        self.lora_a = nn.Linear(base.in_features, rank, bias=False)
        self.lora_b = nn.Linear(rank, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_a.weight, a=5 ** 0.5)
        nn.init.zeros_(self.lora_b.weight)
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_b(self.lora_a(x)) * self.scale


class Attention(nn.Module):
    """Causal multi-head self-attention with separate q, k, v and output projections."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, c // self.heads).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm attention and MLP, each with a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class DecoderLM(nn.Module):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab)."""

    def __init__(self, vocab: int, width: int, heads: int, depth: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def add_lora(model: DecoderLM, rank: int) -> list[nn.Parameter]:
    """Freeze every base weight, wrap each block's q and v projections in LoRA, and return the adapters' params."""
    model.requires_grad_(False)
    for block in model.blocks:
        block.attn.q = LoRALinear(block.attn.q, rank)
        block.attn.v = LoRALinear(block.attn.v, rank)
    return [p for name, p in model.named_parameters() if "lora_" in name]


def main() -> None:
    """Fine-tune the adapters for `--steps` optimizer steps of `--accum` micro-batches and print the loss."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--batch", type=int, default=sizes["batch"], help="sequences per micro-batch")
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = DecoderLM(sizes["vocab"], sizes["width"], sizes["heads"], sizes["depth"], sizes["seq"]).to(device)
    adapters = add_lora(model, args.rank)
    model.to(device).train()
    opt = torch.optim.AdamW(adapters, lr=1e-3, weight_decay=0.0)
    tokens = torch.randint(0, sizes["vocab"], (args.steps * args.accum * args.batch, sizes["seq"] + 1))
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext())
    opt.zero_grad(set_to_none=True)
    for micro, (batch,) in enumerate(loader, start=1):
        batch = batch.to(device, non_blocking=True)
        with autocast:
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()) / args.accum
        loss.backward()
        if micro % args.accum == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
            if micro // args.accum % 10 == 0:
                print(f"step {micro // args.accum}: loss {loss.item() * args.accum:.3f}")


if __name__ == "__main__":
    main()
