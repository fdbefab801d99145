"""The measured window: profiler start/stop, the NVTX ranges (measure, emit_nvtx, one per module), its times,
and a CUDA-graph capture of one iteration for a launch-gap-free timing (standard library and torch only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_server.children.common import export_trace, refusal
from mcp_server.children.contract import MEASURE_RANGE, MODULE_RANGE_PREFIX, RECORDINGS
from mcp_server.children.fx_graphs import node_module_path
from mcp_server.children.pinned import pinned_host_bytes

SLEEP_CALIBRATION_CYCLES = 10_000_000


class MeasuredWindow:
    """The measured window: profiler start/stop, NVTX measure range, emit_nvtx, host wall time and CUDA events.

    `kineto_trace` is where a torch.profiler window exports its trace. With `queue_ahead_ns`, the GPU spins while
    the host enqueues the window, so the events time its work back to back. `on_gpu_done` runs once the window's
    GPU work is done, before the profiler stops (nsys takes seconds to stop; the next pass need not wait).
    `on_start` runs once the profiler has started, before the window's range and events: the ranks' barrier, as
    nsys takes a different time to start on each rank (0.32 and 0.38 s on two H200s). Without `record_shapes`,
    torch's NVTX ranges name their operators alone (see `has_nested`).
    """

    def __init__(
        self, profiler: str, kineto_trace: Path | None = None, queue_ahead_ns: int | None = None,
        on_gpu_done: Callable[[], None] | None = None, scoped: bool = False,
        on_start: Callable[[], None] | None = None, record_shapes: bool = True,
    ) -> None:
        self.profiler = profiler
        self.record_shapes = record_shapes  # off where torch's NVTX ranges cannot read them (`has_nested`)
        self.recording = RECORDINGS[profiler]
        self.scoped = scoped  # `ProfiledCalls` starts and stops the profiler around chosen module calls
        self.kineto_trace = kineto_trace
        self.on_gpu_done = on_gpu_done
        self.on_start = on_start
        self.queue_ahead_ns = queue_ahead_ns
        self.queued_ahead: bool | None = None
        self.wall_time_ns = 0
        self.gpu_elapsed_ns: int | None = None
        self.profiler_start_ns: int | None = None
        self.profiler_stop_ns: int | None = None
        self.pinned_host_bytes: int | None = None
        self._stack: list[Any] = []

    def __enter__(self) -> MeasuredWindow:
        import torch

        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
            self.pinned_host_bytes = pinned_host_bytes()
        if self.recording.torch_profiler:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities, record_shapes=True,
                                                experimental_config=all_threads(torch))
            self._prof.start()
            self._enter(torch.autograd.profiler.record_function(MEASURE_RANGE))
        elif self.recording.nvtx and self.cuda:
            if not self.scoped:
                t0 = time.perf_counter_ns()
                torch.cuda.profiler.start()
                self.profiler_start_ns = time.perf_counter_ns() - t0  # a profiler starting its collection
            if self.on_start is not None:
                self.on_start()
            torch.cuda.nvtx.range_push(MEASURE_RANGE)
            self._enter(torch.autograd.profiler.emit_nvtx(record_shapes=self.record_shapes))
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if self.queue_ahead_ns:
                # The GPU spins while the host enqueues the whole window: the events then time the window's
                # work back to back, its busy time, with none of the host's launch gaps.
                torch.cuda._sleep(sleep_cycles(self.queue_ahead_ns))
            self._events[0].record()
        self._t0 = time.perf_counter_ns()
        return self

    def _enter(self, ctx: Any) -> None:
        ctx.__enter__()
        self._stack.append(ctx)

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.cuda:
            if self.queue_ahead_ns:
                self.queued_ahead = not self._events[0].query()  # still spinning: all of it was queued in time
            self._events[1].record()
            torch.cuda.synchronize()
            self.gpu_elapsed_ns = round(self._events[0].elapsed_time(self._events[1]) * 1e6)
        self.wall_time_ns = time.perf_counter_ns() - self._t0
        if self.on_gpu_done is not None:
            self.on_gpu_done()
        while self._stack:
            self._stack.pop().__exit__(None, None, None)
        if self.recording.torch_profiler:
            self._prof.stop()
            if self.kineto_trace is not None:
                export_trace(self._prof, self.kineto_trace)
        elif self.recording.nvtx and self.cuda:
            torch.cuda.nvtx.range_pop()
            if not self.scoped:
                t0 = time.perf_counter_ns()
                torch.cuda.profiler.stop()
                self.profiler_stop_ns = time.perf_counter_ns() - t0


class KernelTrace:
    """The GPU's kernels and runtime launch calls only (CUPTI activity, no operator or range recording), exported
    as a Kineto trace: the timeline of a window measured without the profiler's host work."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.traced = False  # without CUDA there are no kernels to trace: nothing is written
        self.running = False

    def prepare(self) -> None:
        """Import now what starting the trace imports: torch.profiler looks up Inductor's CUDA-graph setting,
        which imports Inductor: seconds of imports (5.4 s in a fresh process without a bytecode cache, H100 machine)."""
        import torch
        import torch.profiler  # noqa: F401

        if torch.cuda.is_available():
            hasattr(torch, "_inductor")  # torch's lazy import, as torch.profiler.profile.prepare_trace triggers it

    def __enter__(self) -> KernelTrace:
        import torch

        self.traced = self.running = torch.cuda.is_available()
        if self.traced:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            self._prof.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self._prof.stop()
            self.running = False
            export_trace(self._prof, self.path)

    def discard(self) -> None:
        """Stop tracing and write nothing: no traced window ended."""
        if self.running:
            self._prof.stop()
            self.running = False
        self.traced = False


def sleep_cycles(ns: int) -> int:
    """GPU clock cycles for which `torch.cuda._sleep` spins about `ns` nanoseconds, calibrated on this GPU."""
    import torch

    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(SLEEP_CALIBRATION_CYCLES)
    end.record()
    end.synchronize()
    return int(ns * SLEEP_CALIBRATION_CYCLES / (start.elapsed_time(end) * 1e6))


class ModuleRanges:
    """Forward pre/post hooks that wrap every module's forward in a `module:<path>` range (eager only); the
    model itself is named by its class (`root`), as kernels its own forward launches outside every submodule.
    The hooks are global, filtered to the model's modules: nn.TransformerEncoderLayer skips its fused inference
    kernels when one of its modules carries hooks of its own, as a run without the profiler would not."""

    def __init__(self, model: Any, profiler: str, root: str) -> None:
        import torch
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._torch = torch
        self.profiler = profiler
        self.recording = RECORDINGS[profiler]
        self._open: list[Any] = []
        self._root = root
        self._names = {id(module): MODULE_RANGE_PREFIX + (path or root) for path, module in model.named_modules()}
        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]

    def _pre(self, module: Any, args: Any) -> None:
        name = self._names.get(id(module))
        if name is None:
            return
        if self.recording.torch_profiler:
            ctx = self._torch.autograd.profiler.record_function(name)
            ctx.__enter__()
            self._open.append(ctx)
        else:
            self._torch.cuda.nvtx.range_push(name)

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if id(module) not in self._names:
            return
        if self.recording.torch_profiler:
            if self._open:
                self._open.pop().__exit__(None, None, None)
        else:
            self._torch.cuda.nvtx.range_pop()

    def graph_node_path(self, owner: Any, module_path: str) -> str | None:
        """The path of the module an eagerly run GraphModule's node came from (`GlobalModules.graph_node_path`)."""
        def path_of(module: Any) -> str | None:
            name = self._names.get(id(module))
            return None if name is None else name.removeprefix(MODULE_RANGE_PREFIX)

        return node_module_path(owner, module_path, path_of, lambda path: path == self._root)

    def remove(self) -> None:
        """Remove every hook."""
        for handle in self._handles:
            handle.remove()


class ProfiledCalls:
    """Profiling on only during chosen calls of chosen modules (cudaProfilerStart before the call, Stop after):
    `calls` are (module path, call number counted from this object's creation); the model itself is `root`.
    A replay that wants a few launches inside known module calls replays those, not the window.
    `switch(True|False)` turns profiling on or off (torch.cuda.profiler's start and stop by default)."""

    def __init__(self, model: Any, root: str, calls: list[tuple[str, int]],
                 switch: Callable[[bool], None] | None = None) -> None:
        import torch

        self._switch = switch or (lambda on: torch.cuda.profiler.start() if on else torch.cuda.profiler.stop())
        self._wanted: dict[str, set[int]] = {}
        for path, number in calls:
            self._wanted.setdefault(path, set()).add(number)
        self._seen: dict[str, int] = {}
        self._open: dict[str, list[bool]] = {}
        self._depth = 0
        self.started = 0
        self._handles = []
        for path, module in model.named_modules():
            name = path or root
            if name in self._wanted:
                self._handles.append(module.register_forward_pre_hook(self._pre(name)))
                self._handles.append(module.register_forward_hook(self._post(name), always_call=True))

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            number = self._seen.get(name, 0)
            self._seen[name] = number + 1
            chosen = number in self._wanted[name]
            self._open.setdefault(name, []).append(chosen)
            if chosen:
                self._depth += 1
                if self._depth == 1:
                    self.started += 1
                    self._switch(True)

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            if self._open.get(name) and self._open[name].pop():
                self._depth -= 1
                if self._depth == 0:
                    self._switch(False)

        return hook

    def remove(self) -> None:
        """Remove every hook (profiling left off)."""
        for handle in self._handles:
            handle.remove()


def capture_graph(step: Callable[[], None]) -> Callable[[], None] | str:
    """One window iteration captured in a CUDA graph: its replay, or why capture failed.

    Replays run the captured kernels back to back with the GPU's smallest launch gaps, so the window's CUDA
    events time their busy time most closely (no profiler involved). Capture may change what a library runs
    (cuDNN's LSTM did), so a replay's time only stands for the window when its kernels are the same.
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            step()  # allocations of the side stream's pool happen before capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            step()
    except Exception as exc:  # noqa: BLE001 - the reason is reported, the window runs eagerly
        torch.cuda.synchronize()
        return refusal(exc, 300)
    torch.cuda.synchronize()
    return graph.replay


def all_threads(torch: Any) -> Any:
    """The torch profiler's setting that records the operators of every thread, not only the opening thread's and
    those that inherit its state: a serving script's worker threads (torch >= 2.7); None before it."""
    try:
        return torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    except TypeError:
        return None


# torch's NVTX ranges (`emit_nvtx(record_shapes=True)`) read each input's sizes as the range opens; a nested tensor
# of the jagged layout has none, the range is not opened, and its end closes the range around it instead: the
# window's own ended after a jagged model's first operator
NESTED_SHAPES_WARNING = ("the model takes nested (jagged) tensors, whose sizes torch's NVTX ranges cannot read: the "
                         "nsys pass recorded its operators without their input shapes")


def has_nested(values: Any) -> bool:
    """Whether any leaf of `values` (a call's arguments: tensors in lists, tuples, dicts, any pytree) is a nested
    tensor."""
    import torch
    from torch.utils._pytree import tree_leaves

    return any(isinstance(leaf, torch.Tensor) and leaf.is_nested for leaf in tree_leaves(values))


UNPROFILED_BUDGET_NS = 2_000_000_000  # a CPU window's unprofiled repeats stop once they took this long


def unprofiled_windows(step: Any, iters: int, count: int) -> list[dict[str, int]]:
    """Up to `count` windows of `iters` steps without the profiler, each timed on the host clock (a CPU-only run's
    spread from one iteration to the next); fewer when they take more than UNPROFILED_BUDGET_NS together."""
    timed, spent = [], 0
    for _ in range(count):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            step()
        wall = time.perf_counter_ns() - t0
        timed.append({"wall_time_ns": wall})
        spent += wall
        if spent > UNPROFILED_BUDGET_NS:
            break
    return timed
