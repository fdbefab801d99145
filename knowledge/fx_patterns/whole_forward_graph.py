"""Capture the whole forward, eager parts included, in one CUDA graph (model level, IR level: module).

`graph_whole_forward(fn)` wraps a callable (usually the compiled model) so that, per input signature (shapes,
dtypes, devices), it is warmed up on a side stream, captured once in a `torch.cuda.CUDAGraph`, and from then on
replayed: each call copies the inputs into the graph's static inputs, replays, and returns clones of the static
outputs. `compile_around_rnns(model, backend)` compiles, in place, every largest submodule that holds no `nn.RNNBase`
(LSTM, GRU, RNN), so cuDNN's fused RNN runs as written, with its flattened weights, inside the captured graph.

`detach_head(model, name)` takes a child module out of the forward (an `nn.Identity` in its place) for the caller
to apply after the replay: a large output (a vocabulary's logits) is then a fresh tensor, not a graph buffer to copy.

Beyond a `reduce-overhead` recipe: where the recipe's call alone takes clearly longer than back to back, the
difference is Dynamo's guards and CUDA graph trees' per-call checks; the same Inductor graph compiled without CUDA
graphs and wrapped here is a copy in, one replay and a copy out (H100, five examples: 1.08x-1.49x the recipe by
latency, level back to back).

Why not `mode="reduce-overhead"` for an RNN: Dynamo skips a whole frame that calls an RNN module (`allow_rnn` is
off), so `torch.compile(model)` compiles nothing there and Inductor's CUDA graphs never see the RNN, which launches
several kernels per time step and layer and stays launch-bound.
Measured on the H100 (lstm_sequence_encoder: 2-layer LSTM, hidden 512, 128 steps, batch 32): eager 6.9 ms,
torch.compile 6.3 ms, reduce-overhead 5.1 ms, the whole forward captured 1.5 ms (float32, bit-identical
outputs); BF16 weights alone do not help a launch-bound RNN (6.4 ms).

When to apply: launch-bound inference (GPU busy well below the window, thousands of short kernels) whose
launches come from code Dynamo does not compile: RNN modules, graph breaks, custom ops. Static shapes.

Trigger metrics (profile.json / analysis.json): `launch_overhead` bottleneck; most kernels under a module
Dynamo does not trace (e.g. `lstm`: `aten::_cudnn_rnn`, hundreds of kernels per call); `gpu_utilization_pct`
low measured without the profiler.

Expected gain: the window shrinks towards the GPU busy time (here 7.2 ms -> 2.0 ms busy). Costs: one capture
per input signature, the static buffers' memory, and no CPU synchronisation inside the forward (`.item()`,
data-dependent control flow or host-side printing break capture). Exact tier: nothing changes numerically.
Needs CUDA: on a CPU the callable is returned unchanged. Self-contained (torch only): copy it into an
optimized workload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

WARMUP_CALLS = 3


def _has_rnn(module: nn.Module) -> bool:
    return any(isinstance(m, nn.RNNBase) for m in module.modules())


def compile_around_rnns(model: nn.Module, backend: Any) -> int:
    """Compile in place every largest submodule of `model` that holds no RNN; return how many. The RNNs and the
    code around them run eagerly. The compiled forward is set on the instance, so module paths and state_dict
    keys are unchanged (`nn.Module.compile` would not do: Dynamo skips torch.nn's own `_call_impl` as a top
    frame, so a built-in module compiled that way compiles nothing)."""
    compiled = 0
    for child in model.children():
        if isinstance(child, nn.RNNBase):
            continue
        if _has_rnn(child):
            compiled += compile_around_rnns(child, backend)
        else:
            child.forward = torch.compile(child.forward, backend=backend)
            compiled += 1
    return compiled


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    leaves, _ = tree_flatten(args)
    return tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves)


class _Captured:
    """One input signature's graph: its static inputs, static outputs and the graph to replay."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.inputs = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*self.inputs)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        for static, value in zip(tree_flatten(self.inputs)[0], tree_flatten(args)[0], strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(value)
        self.graph.replay()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, self.outputs)


def detach_head(model: nn.Module, name: str) -> nn.Module:
    """Take `model`'s child module `name` out of its forward, in place (an `nn.Identity` in its place), and return
    it: the caller applies it to the captured graph's output, so a large output (a vocabulary's logits) is a fresh
    tensor each call instead of a graph buffer to copy. Load the state_dict before: the keys of `name` go."""
    head = getattr(model, name)
    setattr(model, name, nn.Identity())
    return head


def graph_whole_forward(fn: Callable[..., Any], on_capture: Callable[[], None] | None = None) -> Callable[..., Any]:
    """`fn` replayed from one CUDA graph per input signature, outputs cloned; `fn` itself on a CPU or when
    gradients are on (a captured forward records no autograd graph). `on_capture` runs after each capture."""
    graphs: dict[tuple[Any, ...], _Captured] = {}

    def run(*args: Any) -> Any:
        leaves, _ = tree_flatten(args)
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in leaves)
        if not on_cuda or torch.is_grad_enabled():
            return fn(*args)
        key = _signature(args)
        if key not in graphs:
            graphs[key] = _Captured(fn, args)
            if on_capture is not None:
                on_capture()
        return graphs[key](args)

    return run
