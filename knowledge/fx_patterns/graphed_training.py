"""Replay a training step's forward and backward from CUDA graphs (model level, IR level: module).

`graph_training_module(module, sample_args)` returns `torch.cuda.make_graphed_callables(module, sample_args)`: the
module's forward is captured in one CUDA graph and its backward in another, replayed by autograd as one node, so a
training step that calls it launches two graphs where it launched hundreds of kernels. The loss, `backward()` and
the optimizer stay the caller's code (an optimizer built with `capturable=True` may be graphed apart).

Why not `mode="reduce-overhead"` or the whole-forward graph: Dynamo skips a whole frame that calls an RNN module
(`allow_rnn` is off), so `torch.compile` leaves cuDNN's RNN launch-bound, forward and backward; and the whole-forward
graph (`whole_forward_graph.py`) clones its outputs with no autograd history, for inference only: applied to a
training step, no gradient would reach the parameters.

When to apply: a launch-bound training step (GPU busy well below the window, thousands of short kernels in the
forward and backward phases) whose launches come from code Dynamo does not compile: RNN modules (`aten::gru`,
`aten::lstm` and their `_cudnn_rnn_backward`), custom ops. Static shapes: every batch the shape of `sample_args`
(drop the last short batch).

Trigger metrics (profile.json / analysis.json): run mode `train_step`; the `launch_overhead` bottleneck; most kernel
time under an RNN module in the forward and backward phases; `gpu_utilization_pct` low measured without the profiler.

Expected gain: the forward and backward phases shrink towards their GPU busy time; the optimizer phase and the loss
keep their launches. Costs: two captures (after `warmup_iters` eager iterations on a side stream), static input and
output buffers. Constraints (torch.cuda.make_graphed_callables): autocast inside needs `cache_enabled=False`; the
sample arguments' `requires_grad` must be what the step's inputs have; no host synchronisation or data-dependent
control flow inside the module. Exact tier: nothing changes numerically. Needs CUDA: on a CPU, or for a module
whose sample arguments are not on a GPU, the module is returned unchanged. Self-contained (torch only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

WARMUP_ITERS = 3


def graph_training_module(module: nn.Module, sample_args: tuple[Any, ...], warmup_iters: int = WARMUP_ITERS
                          ) -> nn.Module:
    """`module` with its forward and backward replayed from CUDA graphs for calls shaped as `sample_args` (in
    training mode, as the step calls it); `module` itself on a CPU or when no sample argument is a CUDA tensor."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.is_cuda for a in sample_args)
    if not (torch.cuda.is_available() and on_gpu):
        return module
    return torch.cuda.make_graphed_callables(module, sample_args, num_warmup_iters=warmup_iters)
