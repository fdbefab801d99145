"""decoder_stack beyond the reduced tier's winner by `max-autotune` scoped to its GEMMs: the winner's lines (the whole
model in float16, CUDA graphs) with Inductor's GEMM autotuning on (`max_autotune_gemm`: cuBLAS against Triton's
templates, epilogues fused where a template wins) and nothing else autotuned (`max-autotune` would tune every
pointwise and reduction kernel too, for minutes). The options are knowledge/fx_patterns/inductor_config.py's `gemm`
preset, imported from the repository; measured against the winner by `benchmarks/beyond_check.py --tier reduced`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from cuda_graphs import clone_outputs, cuda_graph_options  # noqa: E402 - the patterns' own code
from decoder_stack import get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from inductor_config import compile_with_options, inductor_options  # noqa: E402

BACKEND_NAME = "decoder_stack_gemm_tuned"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def gemm_tuned_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor with its GEMMs autotuned, and on a GPU CUDA graphs with each call's outputs its own (a replay
    overwrites the graph's output memory)."""
    APPLIED_PASSES["inductor_gemm_autotune"] = APPLIED_PASSES.get("inductor_gemm_autotune", 0) + 1
    if not torch.cuda.is_available():
        return compile_with_options(gm, example_inputs, inductor_options("gemm"))
    return clone_outputs(compile_with_options(gm, example_inputs, {**inductor_options("gemm"), **cuda_graph_options()}))


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16 compiled with this module's backend."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    APPLIED_PASSES["fp16_weights"] = 1
    return torch.compile(model, backend=BACKEND_NAME)


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in float16, converted once."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
