"""depthwise_separable_conv, optimized for inference on the GPU in the exact tier (evidence:
examples/depthwise_separable_conv/analysis.json, H100).

The window is GPU-bound (busy 92.9 % of 1.604 ms without the profiler), led by memory-bound batch norms.

1. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): Inductor fuses the element-wise
   kernels (each batch norm's scale and shift with its ReLU6: the 23 fusible kernels of the analysis) into one
   pass after each convolution and replays the graph as a CUDA graph, outputs cloned.

Not applied: folding the 11 batch norms into the convolutions (knowledge/fx_patterns/conv_bn_fold.py). Under
Inductor a batch norm is already part of the element-wise pass that follows its convolution, so the fold saves no
memory traffic, while its folded weights are recomputed inside the graph on every call. Measured on the H100
against the best free recipe (reduce-overhead, 0.813 ms): 0.978x (95 % CI 0.978-0.979) with the fold, 0.997x
(0.996-0.998) without. Channels-last weights and activations measured 0.996x (0.995-0.997).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from depthwise_separable_conv import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx
from torch.utils._pytree import tree_map

BACKEND_NAME = "depthwise_separable_conv_opt"
APPLIED_PASSES: dict[str, int] = {}


def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def depthwise_separable_conv_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor; on CUDA with CUDA graphs on and the outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's registered backend."""
    return torch.compile(model, backend=BACKEND_NAME)
