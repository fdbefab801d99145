"""Preallocate a decode loop's KV cache so every step has one shape, then replay each step from a CUDA graph (model
level, IR level: module).

A decode loop that grows its KV cache with `torch.cat` gives every step new shapes: its attention reads one key more
each time. Nothing static can be captured (`mode="reduce-overhead"` records a graph per length, after a recompile
per length unless Dynamo goes dynamic), and the host launches every kernel of every step while the GPU, whose
kernels take microseconds at decode sizes, waits for it.

`StaticKVCache(layers, batch, heads, length, head_dim, dtype, device)` holds every layer's keys and values at the
sequence's final length, written in place at the step's positions (`index_copy_` along the sequence, the positions a
device tensor, so nothing in a step reads a host value). `attend(layer, q, k, v, positions)` writes a step's keys
and values and runs `scaled_dot_product_attention` over the whole cache with a mask that hides the positions not
written yet: causal over the prompt, everything written so far for a new token. A step then reads and writes
tensors of one shape whatever its position, and `graph_whole_forward` (knowledge/fx_patterns/whole_forward_graph.py)
captures it once in a `torch.cuda.CUDAGraph`: inputs copied into static buffers, one replay, outputs cloned; the cache
is written inside the graph. The prompt's forward is captured the same way, once per prompt shape.

When to apply: greedy or sampled decoding with a KV cache (a `generate()` loop), launch-bound (GPU busy well below
the window), at inference (no autograd).

Trigger metrics (profile.json / analysis.json): a `growing_kv_cache` finding (an attention operator at one module
path called with one query position and a key length that grows by one per call); `host_bound_window`,
`tiny_kernel_swarm`.

Expected gain (measured on an H200, GPT-2-small-sized greedy decoding of 24 tokens, batch 4: 1.35x the exact tier's
winner `reduce-overhead+fp32`, 1.37x the reduced tier's `reduce-overhead+bf16-cast` in bfloat16): each step's kernel
launches become one replay, so the window shrinks towards its GPU busy time (the prompt's forward and the per-step
token handling left). Attention reads the whole preallocated cache, written or not: negligible while the cache is
short, a cost when it is long (early steps of a long generation read mostly unwritten slots). Costs: the cache sized
for prompt + new tokens up front (a longer generation needs a new cache and a new capture), one capture per prompt
shape. A stop condition read on the host (`if (token == eos).all(): break`) still synchronises once a step; it stays
outside the graph. Exact tier: the masked positions add exact zeros to the softmax, but the attention kernel
may change (masked SDPA against the causal one), so outputs agree to fp32 rounding, not bit for bit. Needs CUDA for
the replay: on a CPU the steps run as written, over the static cache. Self-contained (torch only): copy it into an
optimized workload, with `graph_whole_forward` for the capture.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


class StaticKVCache:
    """Keys and values of `layers` attention layers, `[batch, heads, length, head_dim]` each, preallocated at the
    final sequence length and written in place."""

    def __init__(self, layers: int, batch: int, heads: int, length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        shape = (batch, heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.length = length
        self.slots = torch.arange(length, device=device)

    def mask(self, positions: torch.Tensor) -> torch.Tensor:
        """`[1, 1, queries, length]`, True where a query at `positions` may attend: every slot up to its own."""
        return (self.slots[None, :] <= positions[:, None])[None, None]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write `k`, `v` (`[batch, heads, queries, head_dim]`) at `positions` of `layer`'s cache, then attention of
        `q` over the whole cache, the slots after each query's position masked."""
        self.keys[layer].index_copy_(2, positions, k)
        self.values[layer].index_copy_(2, positions, v)
        return F.scaled_dot_product_attention(q, self.keys[layer], self.values[layer],
                                              attn_mask=self.mask(positions))

