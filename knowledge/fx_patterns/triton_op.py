"""A custom Triton op registered with torch.library, for a chain Inductor leaves in several kernels.

Inductor fuses element-wise and reduction work into generated Triton kernels, but it calls some aten ops as they
are (top-k, sort, cumsum on some devices, searchsorted...): the work on either side of such an op becomes separate
kernels, each reading what the previous one wrote. One hand-written Triton kernel does the chain in one pass.
Registered with `torch.library.custom_op` and given a fake (meta) implementation, it is one opaque op to Dynamo and
Inductor: `torch.compile` keeps the rest of the graph, and `mode="reduce-overhead"` captures its launch in the graph.

The example is the router of a mixture of experts: softmax over the experts, the k largest, renormalised to sum to
one (`topk_softmax`). Inductor runs it as a softmax kernel, aten's top-k (a fallback) and a division kernel; the op
below reads each row's logits once and writes only the k weights and indices. To write another: keep the reference
in plain torch (it is the CPU path and what validation compares with), put the kernel behind `is_cuda`, register the
fake with the output shapes, and check it with `torch.library.opcheck`.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

LIBRARY = "operator_profiler_patterns"
ROWS_PER_PROGRAM = 16  # rows of logits one program routes, at most: a block of rows x the padded expert count,
BLOCK_ELEMENTS = 4096  # held in registers, kept to about this many elements


def triton_available() -> bool:
    """Whether Triton can be imported (it ships with torch's CUDA builds)."""
    return importlib.util.find_spec("triton") is not None


def reference_topk_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain as the model writes it: softmax over the last dimension in float32, top-k, renormalised."""
    weights, index = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), index


@torch.library.custom_op(f"{LIBRARY}::topk_softmax", mutates_args=())
def topk_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest softmax weights of each row of `logits` (last dimension), renormalised to sum to one, as
    float32, with their int64 indices, largest first: one Triton kernel on a GPU, `reference_topk_softmax` else."""
    if logits.is_cuda and triton_available():
        return _topk_softmax_triton(logits, k)
    return reference_topk_softmax(logits, k)


@topk_softmax.register_fake
def _(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*logits.shape[:-1], k)
    return logits.new_empty(shape, dtype=torch.float32), logits.new_empty(shape, dtype=torch.int64)


def _save(ctx: object, inputs: tuple[torch.Tensor, int], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, _ = inputs
    weights, index = output
    ctx.save_for_backward(weights, index)  # type: ignore[attr-defined]
    ctx.shape, ctx.dtype = logits.shape, logits.dtype  # type: ignore[attr-defined]


def _backward(ctx: object, grad_weights: torch.Tensor, _grad_index: torch.Tensor | None) -> tuple[torch.Tensor, None]:
    """The chain's gradient: the weights are a softmax over the k chosen logits, so d logit_j = w_j (g_j - sum w g) at
    the chosen experts, zero elsewhere."""
    weights, index = ctx.saved_tensors  # type: ignore[attr-defined]
    grad = weights * (grad_weights - (weights * grad_weights).sum(dim=-1, keepdim=True))
    logits_grad = torch.zeros(ctx.shape, dtype=torch.float32, device=weights.device)  # type: ignore[attr-defined]
    return logits_grad.scatter(-1, index, grad).to(ctx.dtype), None  # type: ignore[attr-defined]


topk_softmax.register_autograd(_backward, setup_context=_save)


def _topk_softmax_triton(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch `_topk_softmax_kernel` over `logits` (any leading shape, experts last)."""
    import triton

    experts = logits.shape[-1]
    if not 0 < k <= experts:
        raise ValueError(f"k={k} must be between 1 and the {experts} experts")
    rows = logits.reshape(-1, experts).contiguous()
    weights = torch.empty((rows.shape[0], k), dtype=torch.float32, device=rows.device)
    index = torch.empty((rows.shape[0], k), dtype=torch.int64, device=rows.device)
    block_e = triton.next_power_of_2(experts)
    block_rows = max(1, min(ROWS_PER_PROGRAM, BLOCK_ELEMENTS // block_e))
    grid = (triton.cdiv(rows.shape[0], block_rows),)
    _kernel()[grid](rows, weights, index, rows.shape[0], experts, rows.stride(0), K=k,
                    BLOCK_ROWS=block_rows, BLOCK_E=block_e)
    shape = (*logits.shape[:-1], k)
    return weights.reshape(shape), index.reshape(shape)


@functools.cache
def _kernel():  # noqa: ANN202 - a triton.JITFunction, defined on first use: Triton is imported only with a GPU
    """The Triton kernel: each program loads a block of rows once, takes the k largest logits of each by k passes
    of max (the smallest index on a tie) and writes exp(logit - max) / their sum."""
    import triton
    import triton.language as tl

    @triton.jit
    def _topk_softmax_kernel(logits_ptr, weights_ptr, index_ptr, rows, experts, stride,  # noqa: ANN001
                             K: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_E: tl.constexpr):  # noqa: ANN001, N803
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        expert = tl.arange(0, BLOCK_E)
        live = row < rows
        x = tl.load(logits_ptr + row[:, None] * stride + expert[None, :],
                    mask=live[:, None] & (expert[None, :] < experts), other=float("-inf")).to(tl.float32)
        x = tl.where(live[:, None], x, 0.0)  # rows past the end: finite, never written
        top = tl.max(x, axis=1)
        total = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
        left = x
        for _ in tl.static_range(K):  # the sum of the k weights first
            best = tl.max(left, axis=1)
            total += tl.exp(best - top)
            at = tl.min(tl.where(left == best[:, None], expert[None, :], BLOCK_E), axis=1)
            left = tl.where(expert[None, :] == at[:, None], float("-inf"), left)
        left = x
        for j in tl.static_range(K):  # then the same k, written
            best = tl.max(left, axis=1)
            at = tl.min(tl.where(left == best[:, None], expert[None, :], BLOCK_E), axis=1)
            tl.store(weights_ptr + row * K + j, tl.exp(best - top) / total, mask=live)
            tl.store(index_ptr + row * K + j, at.to(tl.int64), mask=live)
            left = tl.where(expert[None, :] == at[:, None], float("-inf"), left)

    return _topk_softmax_kernel


def apply(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk_softmax` through the dispatcher, for a model's forward: `weights, experts = apply(router(x), k)`."""
    return torch.ops.operator_profiler_patterns.topk_softmax(logits, k)
