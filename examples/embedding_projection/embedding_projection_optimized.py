"""embedding_projection, optimized for inference on the GPU in the reduced precision tier (evidence:
examples/embedding_projection/analysis.json, H100).

The window is compute-bound (GPU busy 95.6 % of 7.080 ms without the profiler): 99 % of kernel time is three
FP32 GEMMs on CUDA cores, the 32000-wide vocabulary projection the largest. Its speed of light with FP16/BF16
tensor cores is 0.469 ms.

1. `fp16_weights` (module level, knowledge/fx_patterns/fp16_weights.py): the Linear weights are stored in
   float16 once and each call runs under float16 autocast: the GEMMs run on FP16 tensor cores, and no kernel
   re-casts a weight per call (the free bf16-autocast recipe re-casts the 131 MB vocabulary weight every call).
   The logits stay in float16, as autocast returns them (`with_autocast_keep_dtype`; the reduced tier accepts
   them): a cast back to float32 is one more pass over 524 MB (measured on the H100: 0.567x the free recipe with
   it).
2. `inductor_fusion` (inductor-config, knowledge/fx_patterns/inductor_config.py): Inductor fuses the LayerNorm,
   GELU and residual add (the analysis's 4 fusible kernels).
3. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): the graph is replayed as a CUDA graph,
   outputs cloned. The vocabulary projection runs outside the graph (`outside_graph`), so its 262 MB output is a
   fresh tensor instead of a graph buffer to clone (measured: 0.882x the free recipe with the logits cloned out
   of the graph, 1.121x with the projection outside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from embedding_projection import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx, nn
from torch.utils._pytree import tree_map

BACKEND_NAME = "embedding_projection_opt"
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


def outside_graph(module: torch.nn.Module) -> torch.nn.Module:
    """`module`, in place, run outside any compiled graph (`torch.compiler.disable` on its forward): its outputs
    are fresh tensors, not CUDA-graph buffers to clone. Parameters and state_dict keys are unchanged."""
    module.forward = torch.compiler.disable(module.forward)  # type: ignore[method-assign]
    return module


@torch._dynamo.register_backend(name=BACKEND_NAME)
def embedding_projection_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor (recorded as `inductor_fusion`); on CUDA with CUDA graphs on and the outputs cloned
    (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    APPLIED_PASSES["inductor_fusion"] = APPLIED_PASSES.get("inductor_fusion", 0) + 1
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model, its Linear weights stored in float16 once and its vocabulary projection left outside the graph,
    compiled with this workload's registered backend and run under float16 autocast (logits returned in
    float16)."""
    cast_matmul_weights(model)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    outside_graph(model.logits)
    return with_autocast_keep_dtype(torch.compile(model, backend=BACKEND_NAME))
