"""mlp_activations, optimized beyond the free frontier, reduced tier
(evidence: examples/mlp_activations/recipes.json, NVIDIA H100 80GB HBM3).

1. The tier's winner, `reduce-overhead+fp16-cast` (recipes.json: 243.9 µs per call alone, 141.0 µs per call back to
   back; largest relative error against fp32 eager 0.0022): the whole model cast to float16, its inputs converted
   once by `prepare_inputs`; recorded as `fp16_weights`.
2. `whole_forward_graph` (module level, knowledge/fx_patterns/whole_forward_graph.py): the winner ran under
   `torch.compile(mode="reduce-overhead")`, whose CUDA graph trees check guards, inputs and outputs on every call; a
   call alone took 102.9 µs more than queued back to back, host work the GPU waits for. Here Inductor compiles the
   same graph without CUDA graphs (this workload's backend) and the whole call is captured in one
   `torch.cuda.CUDAGraph` per input signature and replayed: each call copies its inputs in, replays and returns
   copies of the outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from mlp_activations import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch.utils._pytree import tree_flatten, tree_map

BACKEND_NAME = "mlp_activations_opt"
APPLIED_PASSES: dict[str, int] = {}
WARMUP_CALLS = 3


# copied from knowledge/fx_patterns/whole_forward_graph.py
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


@torch._dynamo.register_backend(name=BACKEND_NAME)
def mlp_activations_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile with Inductor's default options, no CUDA graphs: the whole call is captured around it."""
    from torch._inductor.compile_fx import compile_fx

    APPLIED_PASSES["inductor"] = APPLIED_PASSES.get("inductor", 0) + 1
    return compile_fx(gm, example_inputs)


def _captured() -> None:
    APPLIED_PASSES["whole_forward_graph"] = APPLIED_PASSES.get("whole_forward_graph", 0) + 1


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16, compiled with this workload's backend, each call replayed from
    one CUDA graph per input signature on a GPU (taking inputs converted by `prepare_inputs`)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return graph_whole_forward(torch.compile(model, backend=BACKEND_NAME), on_capture=_captured)


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs as the optimized call takes them, converted once before the calls."""
    inputs = tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return inputs
