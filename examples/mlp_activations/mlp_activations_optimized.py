"""mlp_activations, optimized for inference on the GPU in the reduced precision tier (evidence:
examples/mlp_activations/analysis.json, H100).

1. `tf32_scoped` (module level, knowledge/fx_patterns/tf32_scoped.py): the nine float32 GEMMs hold 1.044 ms of
   the 1.065 ms kernel time, on CUDA cores (tensor pipe 0 %). They run on TF32 tensor cores while this model
   runs; the process-wide settings are restored after each call. BF16 weights (knowledge/fx_patterns/
   bf16_weights.py) were tried first and missed the reduced tier: max relative error 1.6-1.9 % > 1e-2 on the
   H100 (validation of that version); TF32 keeps 3 more mantissa bits.
2. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): once the GEMMs are short, the 17
   launches are a large share of the window; Inductor compiles the graph with CUDA graphs on and the outputs
   cloned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from mlp_activations import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch.utils._pytree import tree_map

BACKEND_NAME = "mlp_activations_opt"
APPLIED_PASSES: dict[str, int] = {}


def with_tf32(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with TF32 on for cuBLAS and cuDNN during each call; the previous settings restored afterwards."""

    def run(*args: Any, **kwargs: Any) -> Any:
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            return fn(*args, **kwargs)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn

    return run


def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def mlp_activations_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor; on CUDA with CUDA graphs on and the outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model compiled with this workload's registered backend, its calls run with TF32 on."""
    APPLIED_PASSES["tf32_scoped"] = APPLIED_PASSES.get("tf32_scoped", 0) + 1
    return with_tf32(torch.compile(model, backend=BACKEND_NAME))
