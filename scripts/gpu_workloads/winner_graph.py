"""Beyond the reduced tier's winner, shared by the own models' optimized workloads in this folder.

The winner both own models had on the H100 and the H200 (`reduce-overhead+fp16-cast+channels-last+cudnn-benchmark`,
docs/measurements/h100_optimize_own.json) as plain code: the whole model in float16 and channels_last, cuDNN's
autotuner on, the inputs converted once by `prepare_inputs`. Instead of the recipe's `mode="reduce-overhead"`,
Inductor compiles the graph without CUDA graphs and the whole call is replayed from one `torch.cuda.CUDAGraph` per
input signature (knowledge/fx_patterns/whole_forward_graph.py, imported from the repository, not copied): the host
work reduce-overhead's graph trees do on every call is gone. Each `<name>_optimized.py` takes its baseline's
`get_model_and_input` and this module's `BACKEND_NAME`, `APPLIED_PASSES`, `optimize` and `prepare_inputs` (or builds
the last two for its own winner with `winner_functions`, or, its CUDA graph trees kept, `graph_trees_functions`)
(decode_greedy_static.py takes its backend, `APPLIED_PASSES` and `count_pass` only).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
from whole_forward_graph import graph_whole_forward  # noqa: E402 - the pattern's own code

BACKEND_NAME = "winner_graph_opt"
APPLIED_PASSES: dict[str, int] = {}


def count_pass(name: str) -> None:
    """Count one application of pass `name` in APPLIED_PASSES."""
    APPLIED_PASSES[name] = APPLIED_PASSES.get(name, 0) + 1


@torch._dynamo.register_backend(name=BACKEND_NAME)
def winner_graph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor's default options, no CUDA graphs: the whole call is captured around it."""
    from torch._inductor.compile_fx import compile_fx

    count_pass("inductor")
    return compile_fx(gm, example_inputs)


def winner_functions(channels_last: bool = True, cudnn_benchmark: bool = True, backend: str = BACKEND_NAME) -> tuple[
        Callable[[torch.nn.Module], Any], Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
    """`optimize` and `prepare_inputs` for a winner `reduce-overhead+fp16-cast[+channels-last][+cudnn-benchmark]`
    (the parts named by the flags), its CUDA graph trees replaced by one CUDA graph of the whole call; `backend`: a
    registered backend that rewrites the graph before it calls `winner_graph_backend` (default: that one alone)."""

    def optimize(model: torch.nn.Module) -> Any:
        """The model in float16 (channels_last, cuDNN's autotuner on, as the flags say), compiled with this module's
        backend, each call replayed from one CUDA graph per input signature on a GPU (taking inputs converted by
        `prepare_inputs`)."""
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = cudnn_benchmark
        model = model.to(torch.float16)
        count_pass("fp16_weights")
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            count_pass("channels_last")
        return graph_whole_forward(torch.compile(model, backend=backend), on_capture=lambda: count_pass(
            "whole_forward_graph"))

    def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """The baseline's inputs as the optimized call takes them (float16; 4-d ones channels_last when the model
        is), converted once."""
        inputs = tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                       for x in inputs)
        if not channels_last:
            return inputs
        return tuple(x.contiguous(memory_format=torch.channels_last)
                     if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 4 else x for x in inputs)

    return optimize, prepare_inputs


def graph_trees_functions(cudnn_benchmark: bool, backend: str | None = None) -> tuple[
        Callable[[torch.nn.Module], Any], Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
    """`optimize` and `prepare_inputs` for a winner `reduce-overhead+fp16-cast[+cudnn-benchmark]` run as its recipe
    runs, CUDA graph trees kept (each call's outputs copied: the next replay overwrites them); `backend`: a registered
    backend that compiles with graph trees itself, in place of `mode="reduce-overhead"`."""

    def optimize(model: torch.nn.Module) -> Any:
        """The model in float16, compiled with CUDA graph trees; each call's outputs copied."""
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = cudnn_benchmark
        model = model.to(torch.float16)
        compiled = (torch.compile(model, backend=backend) if backend is not None
                    else torch.compile(model, mode="reduce-overhead"))

        def run(*args: Any) -> Any:
            torch.compiler.cudagraph_mark_step_begin()
            return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, compiled(*args))

        return run

    def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """The baseline's inputs in float16 (integer ones as they are), converted once."""
        return tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                     for x in inputs)

    return optimize, prepare_inputs


# The winner both own models had on the H100 and the H200.
optimize, prepare_inputs = winner_functions(channels_last=True, cudnn_benchmark=True)
