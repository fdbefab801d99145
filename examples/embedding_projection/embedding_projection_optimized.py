"""embedding_projection, optimized for inference on the GPU in the exact tier (evidence:
examples/embedding_projection/analysis.json, H100).

The window is compute-bound (GPU busy 95.6 % of 7.080 ms without the profiler): 99 % of kernel time is three
FP32 GEMMs on CUDA cores, the 32000-wide vocabulary projection the largest. The exact tier keeps them in float32,
so what is left is:

1. `inductor_fusion` (inductor-config, knowledge/fx_patterns/inductor_config.py): Inductor fuses the LayerNorm,
   GELU and residual add (the analysis's 4 fusible kernels, 84 us).
2. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): the graph is replayed as a CUDA graph,
   outputs cloned. The vocabulary projection runs outside the graph (`outside_graph`): its output, 524 MB of
   float32 logits, is then a fresh tensor instead of a graph buffer to clone. Measured on the H100 against the best
   free recipe (reduce-overhead, 6.74 ms): 0.950x (95 % CI 0.946-0.957) with the logits cloned out of the graph,
   0.998x (0.998-0.998) with the projection outside it.

Moving the GEMMs to tensor cores (the analysis's first opportunity, 6.05 ms) needs the reduced tier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from embedding_projection import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx
from torch.utils._pytree import tree_map

BACKEND_NAME = "embedding_projection_opt"
APPLIED_PASSES: dict[str, int] = {}


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
    """The model, its vocabulary projection left outside the graph, compiled with this workload's registered
    backend."""
    outside_graph(model.logits)
    return torch.compile(model, backend=BACKEND_NAME)
