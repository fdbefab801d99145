"""Run GEMMs and convolutions on FP16 tensor cores with their weights stored in FP16 once (IR level: module).

`cast_matmul_weights(model)` stores the weights and biases of the model's `nn.Linear` and convolution modules
in float16, once and in place (module paths and state_dict keys unchanged; a weight tied to an embedding is
converted with it). `with_autocast(fn)` runs each call under `torch.autocast(dtype=float16)` and returns the
outputs that autocast left in float16 as float32; `with_autocast_keep_dtype(fn)` leaves them in float16, which
the reduced tier accepts (no cast pass over a large output); `autocast_in_forward(model)` puts the autocast
region inside the model's forward, so the compiled graph holds it and nothing wraps the compiled model per call.
Together they give autocast's tensor-core GEMMs without its per-call weight casts: autocast casts a float32
weight to float16 on every call (one read of 4 bytes and one write of 2 bytes per parameter, then the GEMM's read
of 2), while a weight already in float16 is read once as 2 bytes. Reductions, normalisations and softmax stay in
float32 where autocast keeps them there.

Why float16 and not bfloat16 in the reduced tier: both run on the same tensor cores at the same peak, but
float16 keeps 10 mantissa bits (bfloat16: 7), about 8x less rounding error per value. Measured on the H100 with
validate's error metric (max |diff| / (|ref| + rms(ref))): bf16 autocast gives 1.2-4.5 % on mlp_activations,
sdpa_attention, embedding_projection and gpt2 (over the tier's 1e-2); float16 gives 0.14-0.53 %. Its price is
range: float16 overflows above 65504 (bfloat16 has float32's range), so it suits activations of normalised
networks; validate's finite check catches an overflow on the inputs it runs.

When to apply: the reduced precision tier, on a tensor-core GPU, when float32 GEMMs/convolutions dominate and
their weights are a large share of the bytes moved (large projections, small batches), or when BF16
(`bf16_weights.py`, `dtype_autocast.py`) misses the tier's tolerance.

Trigger metrics (profile.json / analysis.json): an `fp32_matmul` finding or the opportunity "Run N FP32 GEMMs
on tensor cores"; in a profile under autocast, `aten::_to_copy` kernels as many as the weights per call.

Expected gain: the GEMMs' tensor-core speedup (float16 peak is twice TF32's on H100) and, over autocast, the
weight-cast traffic (6 bytes per parameter per call). Precision changes: validate in the reduced tier and
report the error distribution. Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

MATMUL_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)


def cast_matmul_weights(model: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """The same model with the parameters of its Linear and convolution modules stored in `dtype` once, in
    place; every other parameter and buffer (norms, embeddings not tied to a Linear) keeps its dtype."""
    for module in model.modules():
        if isinstance(module, MATMUL_MODULES):
            module.to(dtype)
    return model


def with_autocast(fn: Callable[..., Any], dtype: torch.dtype = torch.float16) -> Callable[..., Any]:
    """`fn` run under `torch.autocast(dtype=dtype)` on the device of its tensor arguments (CUDA when any is on
    CUDA, else CPU); outputs in `dtype` come back as float32, every other output unchanged."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            out = fn(*args, **kwargs)
        return tree_map(lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v, out)

    return run


def with_autocast_keep_dtype(fn: Callable[..., Any], dtype: torch.dtype = torch.float16) -> Callable[..., Any]:
    """`fn` run under `torch.autocast(dtype=dtype)` on the device of its tensor arguments (CUDA when any is on
    CUDA, else CPU); outputs as autocast returns them, those it computed in `dtype` left in `dtype`: no cast pass
    over a large output. The reduced tier accepts a float32 output returned in float16 or bfloat16."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            return fn(*args, **kwargs)

    return run


def autocast_in_forward(
    model: nn.Module, dtype: torch.dtype = torch.float16, out_dtype: torch.dtype | None = torch.float32
) -> nn.Module:
    """The same model, its forward run under `torch.autocast(dtype=dtype)` from inside: set on the instance, so
    `torch.compile(model)` traces the autocast region and the casts back into its graph, and no Python wrapper or
    context manager runs around the compiled model on each call (`with_autocast` does). Outputs autocast computed
    in `dtype` come back as `out_dtype` (inside the graph, where Inductor fuses the cast), or stay in `dtype` with
    `out_dtype=None`. Module paths and state_dict keys are unchanged."""
    forward = model.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            out = forward(*args, **kwargs)
        if out_dtype is None:
            return out
        return tree_map(lambda v: v.to(out_dtype) if isinstance(v, torch.Tensor) and v.dtype == dtype else v, out)

    model.forward = run
    return model
