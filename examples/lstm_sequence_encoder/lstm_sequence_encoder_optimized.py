"""lstm_sequence_encoder, optimized for inference on the GPU in the reduced precision tier (evidence:
examples/lstm_sequence_encoder/analysis.json, H100).

1. `whole_forward_graph` (module level, knowledge/fx_patterns/whole_forward_graph.py): the window is launch-bound
   (GPU busy 28.2 % of 7.185 ms without the profiler; 535 kernels, 98.9 % of kernel time in `lstm`, whose cuDNN
   RNN launches several kernels per time step and layer). `torch.compile(mode="reduce-overhead")` cannot help:
   Dynamo skips the whole forward, which calls the LSTM, so no CUDA graph covers its launches. Here the LSTM runs
   as written (cuDNN, flattened weights), the embedding and head are compiled by this workload's backend
   (Inductor), and the whole forward is captured in one CUDA graph per input signature and replayed, outputs
   cloned.
2. `fp16_weights` (module level, knowledge/fx_patterns/fp16_weights.py): on a GPU the LSTM's and the head's
   weights are stored in float16 once and each call runs under float16 autocast: cuDNN's fused LSTM runs in
   float16 (its recurrent GEMMs on FP16 tensor cores, reading half the weight bytes every time step) and no
   kernel re-casts a weight per call. The (32, 10) logits come back as float32. On a CPU nothing changes
   (oneDNN has no float16 LSTM).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lstm_sequence_encoder import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

BACKEND_NAME = "lstm_sequence_encoder_opt"
APPLIED_PASSES: dict[str, int] = {}

WARMUP_CALLS = 3


MATMUL_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)


def cast_matmul_weights(model: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """The same model with the parameters of its Linear and convolution modules stored in `dtype` once, in
    place; every other parameter and buffer (norms, embeddings not tied to a Linear) keeps its dtype."""
    for module in model.modules():
        if isinstance(module, MATMUL_MODULES):
            module.to(dtype)
    return model


def with_autocast(fn: Callable[..., Any], dtype: torch.dtype = torch.float16) -> Callable[..., Any]:
    """`fn` run under `torch.autocast(dtype=dtype)` on the device of its tensor arguments (CUDA when any is on
    CUDA, else CPU); outputs in `dtype` come back as float32, every other output unchanged."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            out = fn(*args, **kwargs)
        return tree_map(lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v, out)

    return run


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
def lstm_sequence_encoder_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Compile the pieces Dynamo traces (the embedding, the head) with Inductor's default options."""
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _captured() -> None:
    APPLIED_PASSES["whole_forward_graph"] = APPLIED_PASSES.get("whole_forward_graph", 0) + 1


def optimize(model: torch.nn.Module) -> Any:
    """The submodules around the LSTM compiled with this workload's registered backend, and the whole forward
    replayed from a CUDA graph on a GPU, there with the LSTM's and the head's weights stored in float16 and each
    call run under float16 autocast (logits returned as float32)."""
    compile_around_rnns(model, BACKEND_NAME)
    if not any(p.is_cuda for p in model.parameters()):
        return graph_whole_forward(model, on_capture=_captured)
    cast_matmul_weights(model)
    for module in model.modules():
        if isinstance(module, nn.RNNBase):
            module.to(torch.float16)  # cuDNN's fused LSTM keeps its flattened weights, now in float16
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return with_autocast(graph_whole_forward(model, on_capture=_captured))
