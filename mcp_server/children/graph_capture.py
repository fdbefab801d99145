"""CUDA graphs the workload captures itself, recorded for attribution (standard library and torch only).

A kernel replayed from a graph is launched by the graph launch, inside no operator range. Under nsys with
`--cuda-graph-trace=node`, each replayed kernel names its graph node, and the node's creation is recorded where it
was captured: `GraphCaptureRanges` makes every capture happen inside nsys's collection (it starts the profiler
collection at the first capture; the window's own stop ends it) with the window's ranges open: the
`operator_profiler::graph_capture` range, torch's operator ranges (`emit_nvtx`), every module's range (global
hooks) and the user's call sites. It wraps `torch.cuda.CUDAGraph.capture_begin` and `capture_end`, which
`torch.cuda.graph`, `make_graphed_callables` and CUDA-graph trees all call. Only the nsys pass installs it. Outside
eager mode (the workload's own `optimize()`), the call-site mode stays off, as in the window: Dynamo guards on the
torch-function mode stack, so a compiled region entered during the capture would compile again inside it. Nor are
the hooks global there: a module compiled whole (`torch.compile(model)`) traces `_call_impl`, which reads the global
hook dicts, so Dynamo guards on them. The harness's model's own modules take hooks of their own instead, while Dynamo
skips its guards on empty per-module hook dicts (its default, `skip_nnmodule_hook_guards`) and a module has no hook of
the workload's: a compiled region runs as compiled, and the modules called eagerly around it (an RNN that Dynamo
skips, the code a hand-written capture wraps) are named.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import Any

from mcp_server.children.contract import GRAPH_CAPTURE_RANGE
from mcp_server.children.global_modules import GlobalModules
from mcp_server.children.sites import UserFrames, call_sites


class GraphCaptureRanges:
    """While installed, every CUDA graph capture runs inside the profiler's collection with the window's ranges."""

    def __init__(self, eager: bool = True) -> None:
        self.eager = eager
        self.models: list[Any] = []  # outside eager mode, the modules whose calls are named (`watch`)
        self.captures = 0
        self._original: tuple[Any, Any] | None = None
        self._open: ExitStack | None = None
        self._frames: UserFrames | None = None

    def install(self) -> GraphCaptureRanges:
        """Wrap torch.cuda.CUDAGraph's capture_begin and capture_end (once)."""
        import torch

        graph = torch.cuda.CUDAGraph
        begin, end = graph.capture_begin, graph.capture_end
        self._original = (begin, end)
        ranges = self

        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            ranges._begin()
            return begin(self, *args, **kwargs)

        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return end(self, *args, **kwargs)
            finally:
                ranges._end()

        graph.capture_begin, graph.capture_end = capture_begin, capture_end
        return self

    def watch(self, model: Any) -> None:
        """Outside eager mode, name the calls of `model`'s modules made during a capture."""
        self.models.append(model)

    def remove(self) -> None:
        """Restore torch.cuda.CUDAGraph."""
        if self._original is not None:
            import torch

            torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end = self._original
            self._original = None

    def _begin(self) -> None:
        """Before the capture starts (a synchronisation is still allowed): collection on, the ranges open."""
        import torch

        self.captures += 1
        stack = ExitStack()
        torch.cuda.profiler.start()  # a second start while collecting is a no-op
        torch.cuda.nvtx.range_push(GRAPH_CAPTURE_RANGE)
        stack.callback(torch.cuda.nvtx.range_pop)
        outside_window = not torch.autograd._profiler_enabled()  # inside the window its own ranges are on
        if outside_window:
            stack.enter_context(torch.autograd.profiler.emit_nvtx(record_shapes=True))
        hooked = None if self.eager else _hookable(self.models)
        if outside_window and (self.eager or hooked):
            modules = GlobalModules("nvtx").install(hooked)
            modules.ranging = True
            stack.callback(modules.remove)
        if outside_window and self.eager:
            self._frames = self._frames or UserFrames()
            stack.enter_context(call_sites("nvtx", self._frames))
        self._open = stack

    def _end(self) -> None:
        """After the capture ended: the ranges closed (collection goes on until the window's end)."""
        if self._open is not None:
            stack, self._open = self._open, None
            stack.close()


def _hookable(models: list[Any]) -> list[Any]:
    """The modules of `models` that may take hooks while compiled code runs: none when Dynamo guards on empty hook
    dicts (`skip_nnmodule_hook_guards` off: a compiled region would compile again inside the capture), else every
    module without hooks of its own (a non-empty hook dict is traced into compiled code). Dynamo not loaded, nothing
    is compiled: it is not imported for this."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and not dynamo.config.skip_nnmodule_hook_guards:
        return []
    hook_dicts = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                  "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
    return [m for model in models for m in model.modules() if not any(getattr(m, d, None) for d in hook_dicts)]
