"""A candidate beyond sdpa_attention's reduced-tier winner (eager+fp16-cast), benched against it and kept as the
record of the attempt: the winner's whole-model float16 cast, the q, k and v projections fused into one GEMM
(knowledge/fx_patterns/qkv_fusion.py) by Inductor's graph compiled without CUDA graphs, and the whole call replayed
from one CUDA graph (knowledge/fx_patterns/whole_forward_graph.py). Both patterns are imported from the repository.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "examples" / "sdpa_attention"), str(REPO / "knowledge" / "fx_patterns")]
from qkv_fusion import fuse_parallel_linears  # noqa: E402 - the pattern's own code
from sdpa_attention import get_model_and_input  # noqa: E402,F401 - same model and inputs as the baseline
from whole_forward_graph import graph_whole_forward  # noqa: E402 - the pattern's own code

BACKEND_NAME = "sdpa_attention_qkv_graph"
APPLIED_PASSES: dict[str, int] = {}


def _count(name: str, times: int = 1) -> None:
    APPLIED_PASSES[name] = APPLIED_PASSES.get(name, 0) + times


@torch._dynamo.register_backend(name=BACKEND_NAME)
def qkv_graph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Fuse parallel linears, then compile with Inductor's default options, no CUDA graphs."""
    from torch._inductor.compile_fx import compile_fx

    if fused := fuse_parallel_linears(gm):
        _count("qkv_fusion", fused)
    _count("inductor")
    return compile_fx(gm, example_inputs)


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16, compiled with this backend, each call replayed from one CUDA graph per signature."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    _count("fp16_weights")
    return graph_whole_forward(torch.compile(model, backend=BACKEND_NAME),
                               on_capture=lambda: _count("whole_forward_graph"))


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs in float16, converted once before the calls."""
    return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
