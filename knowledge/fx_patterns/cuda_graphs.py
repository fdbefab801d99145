"""Replay the compiled graph as a CUDA graph (torch.compile configuration, IR level: inductor-config).

`cuda_graph_backend(gm, example_inputs)` hands the graph to Inductor with `triton.cudagraphs` on (what
`torch.compile(mode="reduce-overhead")` does) and clones the outputs: a CUDA graph writes every replay's
outputs into the same static buffers, so without the clone a caller holding the previous result sees it
overwritten (validate's `output_caching` check fails, and Inductor raises on access to an overwritten output).

When to apply: launch-bound inference with static shapes, i.e. many short kernels and a GPU that idles
between them while the CPU launches.

Trigger metrics (profile.json): window `gpu_busy_time_ns` / `wall_time_ns` well below 0.5 (per iteration);
mean kernel duration (`kernel_time_ns` / `kernel_count`) under ~10 µs; `kernel_count` in the hundreds or
more per iteration; idle gaps between kernels comparable to the kernels themselves.

Expected gain: CPU launch overhead (~3-10 µs per kernel) is paid once per graph instead of per kernel: up to
wall / GPU-busy on launch-bound windows (often 1.5-3× for small models), nothing for GPU-bound ones. Costs:
one recording per input shape, memory held by the static buffers, and dynamic shapes or CPU sync points
(`.item()`, data-dependent control flow) split or disable the graph. Needs CUDA: on a CPU the option is
accepted and ignored, so a CPU run can only check the configuration and the output cloning, not the replay.

Large outputs: the clone reads and writes every output byte once per call. When an output is large against the
window (measured on the H100: embedding_projection's 524 MB of float32 logits, about 0.35 ms of a 6.74 ms
window), `outside_graph(module)` runs the module that produces it outside the compiled graph instead: its
output is a fresh tensor the caller owns, so nothing is cloned, and the graph's own outputs (the module's
input) are small. It costs one graph break and the module's own kernel launches, which a GPU-bound window hides.
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

CUDA_GRAPH_OPTIONS: dict[str, Any] = {"triton.cudagraphs": True}


def cuda_graph_options() -> dict[str, Any]:
    """The Inductor config patch that turns CUDA graphs on (same keys as mode='reduce-overhead')."""
    return dict(CUDA_GRAPH_OPTIONS)


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


def cuda_graph_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Compile with Inductor and CUDA graphs, outputs cloned (use inside a registered backend)."""
    from torch._inductor.compile_fx import compile_fx

    return clone_outputs(compile_fx(gm, example_inputs, config_patches=cuda_graph_options()))
