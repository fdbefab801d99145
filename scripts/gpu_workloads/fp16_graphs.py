"""The optimization shared by the reduced-tier optimized workloads in this folder (workloads outside examples/).

The weights of the model's Linear and convolution modules stored in float16 once, each call run under float16
autocast with the outputs returned as float32 (knowledge/fx_patterns/fp16_weights.py), compiled by Inductor with
CUDA graphs and the outputs cloned (knowledge/fx_patterns/cuda_graphs.py). Each `<name>_optimized.py` takes its
baseline's `get_model_and_input` and this module's `BACKEND_NAME`, `APPLIED_PASSES` and `optimize`, or
`optimize_keep_dtype` to leave the outputs in float16 as autocast returns them (the reduced tier accepts it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

BACKEND_NAME = "fp16_graphs_opt"
APPLIED_PASSES: dict[str, int] = {}

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

def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def fp16_graphs_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor; on CUDA with CUDA graphs on and the outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model, its Linear and convolution weights stored in float16, compiled with this workload's backend and
    run under float16 autocast (outputs returned as float32)."""
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return with_autocast(torch.compile(cast_matmul_weights(model), backend=BACKEND_NAME))


def optimize_keep_dtype(model: torch.nn.Module) -> Any:
    """As `optimize`, the outputs left in float16 as autocast returns them (no cast pass back to float32)."""
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return with_autocast_keep_dtype(torch.compile(cast_matmul_weights(model), backend=BACKEND_NAME))
