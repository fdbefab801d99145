"""Keep weights and activations in bfloat16 end to end (model-level, IR level: module).

`keep_in_bf16(model)` converts the model's floating parameters and buffers to bfloat16 once and hooks it so that
floating inputs are cast to bfloat16 on the way in and floating outputs back to float32 on the way out (the same
model object: module paths, and so the profiles' module names, are unchanged). Unlike a
cast inside the graph (`dtype_autocast.py`), no kernel re-casts a weight on every call: the weights are stored in
bfloat16, every GEMM, convolution and recurrent kernel (cuDNN's fused LSTM/GRU included) reads half the bytes,
and the only casts left are the inputs' and the outputs'.

When to apply: the reduced precision tier, on a tensor-core GPU, when float32 GEMMs/convolutions/RNNs dominate
and a `dtype_autocast`-style rewrite shows cast kernels (`aten::_to_copy`, `aten::copy_`) per weight per call,
or when the weights' bytes dominate a memory-bound window (embeddings, large projections, LSTMs).

Trigger metrics (profile.json / analysis.json): an `fp32_matmul`/`fp32_conv` finding; `flops_by_precision`
all `fp32`; in an optimized profile, `aten::_to_copy` kernels as many as the weights; an LSTM's
`_cudnn_rnn` in float32.

Expected gain: the tensor-core speedup of `dtype_autocast` without its per-call weight casts, and half the
weight and activation bytes (2× on memory-bound GEMVs/embeddings). Precision changes: validate in the reduced
tier (float32 outputs held to 1e-2) and report the error distribution. Apply it in `optimize(model)`, after the
baseline's weights are loaded (validate and bench load them before calling `optimize`). Self-contained (torch only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map


def _to(dtype: torch.dtype, value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def keep_in_bf16(model: nn.Module, out_dtype: torch.dtype = torch.float32) -> nn.Module:
    """The same model, its floating parameters and buffers converted to bfloat16 once, behind float32 edges:
    a forward pre-hook casts floating inputs in and a forward hook casts floating outputs back (nothing else is
    cast). The model object, its module paths and its state_dict keys stay the same."""

    def cast_in(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return tree_map(lambda v: _to(torch.bfloat16, v), (args, kwargs))

    def cast_out(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        return tree_map(lambda v: _to(out_dtype, v), output)

    model.to(torch.bfloat16)
    model.register_forward_pre_hook(cast_in, with_kwargs=True)
    model.register_forward_hook(cast_out, with_kwargs=True)
    return model


def weight_dtypes(model: nn.Module) -> set[torch.dtype]:
    """The dtypes of the model's floating parameters and buffers (one, bfloat16, after keep_in_bf16)."""
    tensors = [*model.parameters(), *model.buffers()]
    return {t.dtype for t in tensors if t.is_floating_point()}
