"""depthwise_separable_conv, optimized for inference on the GPU in the reduced precision tier (evidence:
examples/depthwise_separable_conv/analysis.json, H100).

The window is GPU-bound (busy 92.9 % of 1.604 ms without the profiler): 5 convolutions in FP32 on CUDA cores
(tensor pipe 0 %, 439 us; cuDNN chose FP32 kernels for these shapes although TF32 is allowed), 11 unfolded batch
norms and ReLU6s (the analysis's 23 fusible kernels), and cuDNN's layout conversions.

1. `fp16_weights` (module level, knowledge/fx_patterns/fp16_weights.py): the convolution and Linear weights are
   stored in float16 once and the forward runs under float16 autocast, outputs returned as float32: the
   convolutions run on FP16 tensor cores over half the bytes, and no kernel re-casts a weight per call (the free
   bf16-autocast recipe does). The autocast region sits inside the forward (`autocast_in_forward`), so the
   compiled graph holds it and nothing wraps the compiled model per call: measured on the H100 in one bench
   process, 1.043x the free recipe (95 % CI 1.043-1.044) against 1.037x (1.036-1.038) with `with_autocast`
   around the compiled model.
2. `channels_last` (module level, knowledge/fx_patterns/channels_last.py): the convolution weights are stored
   channels-last once, so activations stay NHWC, the layout of cuDNN's tensor-core kernels.
3. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): Inductor fuses each batch norm's scale
   and shift with its ReLU6 into one pass after each convolution and replays the graph as a CUDA graph, outputs
   cloned.

Not applied: folding the batch norms into the convolutions (knowledge/fx_patterns/conv_bn_fold.py). Under Inductor
each batch norm is already part of the element-wise pass after its convolution, so the fold saves no traffic while
its folded weights are recomputed inside the graph on every call. Measured on the H100 in the exact tier against
the best free recipe (reduce-overhead, 0.813 ms): 0.978x (95 % CI 0.978-0.979) with the fold, 0.997x
(0.996-0.998) without.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from depthwise_separable_conv import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx, nn
from torch.utils._pytree import tree_map

BACKEND_NAME = "depthwise_separable_conv_opt"
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
    """The model, its convolution and Linear weights stored in float16 and channels-last once and its forward run
    under float16 autocast (outputs returned as float32), compiled with this workload's registered backend."""
    model.to(memory_format=torch.channels_last)
    APPLIED_PASSES["channels_last"] = APPLIED_PASSES.get("channels_last", 0) + 1
    cast_matmul_weights(model)
    autocast_in_forward(model)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return torch.compile(model, backend=BACKEND_NAME)
