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
from decoder_stack import get_model_and_input  # noqa: E402, F401 - same model and inputs as the baseline
from inductor_config import compile_with_options, inductor_options  # noqa: E402 - the pattern's own code

BACKEND_NAME = "decoder_stack_gemm_tuned"
APPLIED_PASSES: dict[str, int] = {}


@torch._dynamo.register_backend(name=BACKEND_NAME)
def gemm_tuned_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Inductor with its GEMMs autotuned, and CUDA graphs on a GPU."""
    options = inductor_options("gemm")
    if torch.cuda.is_available():
        options["triton.cudagraphs"] = True
    APPLIED_PASSES["inductor_gemm_autotune"] = APPLIED_PASSES.get("inductor_gemm_autotune", 0) + 1
    return compile_with_options(gm, example_inputs, options)


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16 compiled with this module's backend; each call's output its own (a CUDA graph's replay
    overwrites the memory it returned)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    APPLIED_PASSES["fp16_weights"] = 1
    compiled = torch.compile(model, backend=BACKEND_NAME)

    def run(*inputs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*inputs).clone()

    return run


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in float16, converted once."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
