"""A plain training script whose model normalises with its own Triton kernels: RMSNorm's forward and backward are
`@triton.jit` functions launched by a `torch.autograd.Function` (not registered with `torch.library`, so no aten
operator encloses their launches), in a Llama-style language model (SDPA attention, a SwiGLU MLP) trained with
AdamW. argparse and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/triton_norm_train.py

Without CUDA (or Triton) the norm runs as plain torch code. `OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU machine
    triton = None

SIZES = {"gpu": {"width": 768, "heads": 12, "depth": 4, "seq": 512, "batch": 8, "vocab": 16384},
         "small": {"width": 32, "heads": 2, "depth": 2, "seq": 16, "batch": 2, "vocab": 64}}
EPS = 1e-6

if triton is not None:
    @triton.jit
    def _rms_forward(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + row, rstd)

    @triton.jit
    def _rms_backward(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_part_ptr, n_cols, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        g = dy * w
        dx = rstd * g - x * (rstd * rstd * rstd) * (tl.sum(g * x, axis=0) / n_cols)
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        tl.store(dw_part_ptr + row * n_cols + cols, dy * x * rstd, mask=mask)


class TritonRMSNorm(torch.autograd.Function):
    """RMSNorm by two Triton kernels; the weight's gradient is the sum of per-row parts (an aten sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = torch.empty_like(rows)
        rstd = torch.empty(rows.shape[0], device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(rows.shape[1])
        _rms_forward[(rows.shape[0],)](rows, weight, y, rstd, rows.shape[1], EPS, BLOCK=block)
        ctx.save_for_backward(rows, weight, rstd)
        return y.view_as(x)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, weight, rstd = ctx.saved_tensors
        dy_rows = dy.reshape(rows.shape).contiguous()
        dx = torch.empty_like(rows)
        dw_part = torch.empty(rows.shape, device=rows.device, dtype=torch.float32)
        block = triton.next_power_of_2(rows.shape[1])
        _rms_backward[(rows.shape[0],)](dy_rows, rows, weight, rstd, dx, dw_part, rows.shape[1], BLOCK=block)
        return dx.view(dy.shape), dw_part.sum(0).to(weight.dtype)


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is not None and x.is_cuda:
            return TritonRMSNorm.apply(x, self.weight)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width, bias=False), nn.Linear(width, width, bias=False)
        self.gate_up = nn.Linear(width, 2 * 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LanguageModel(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm, self.head = RMSNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" or device == "cpu"
                  else "gpu"]
    torch.manual_seed(0)
    model = LanguageModel(sizes["vocab"], sizes["width"], sizes["heads"], sizes["depth"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["seq"] + 1), device=device)
    for step in range(args.steps):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
