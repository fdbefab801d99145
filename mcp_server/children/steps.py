"""A script profiled as it is: run unmodified as `__main__`, its measured window chosen by its own steps
(standard library and torch only).

A step is one `step()` of the script's first optimizer to step (a training script), or with `--window-fn NAME` one
call of the function or method named NAME, or of the nn.Module class named NAME (an inference script), or with
`--window-fn backward` one `backward()` (a training loop that updates its parameters without torch.optim). After
`--warmup-iters` steps the window opens; it closes after `--iters` more, and the next window (the timing pass
measures several) opens at once. Once the last window closed the script is stopped (`StopScript`): nothing it
would run afterwards disturbs another pass's window. Module ranges come from torch's global module hooks
(`GlobalModules`), call sites and worker threads as in the contract's eager window, so the profile is assembled
as for a workload of the contract.

Boundaries, found without editing the script: optimizer steps through torch's global step hooks (the first step's
end there, later steps through a wrapper of that optimizer's `step`, so the window opens and closes outside the
optimizer's own profiler range); a function through a wrapper put where the script finds it (its class, or the
globals that name it) once the first call is seen running (at its first module call); a module class through the
global module hooks.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from mcp_server.children import distributed, fx_graphs, global_modules, launch_sites, script_ranks, sites, window_sites
from mcp_server.children.common import ContractError
from mcp_server.children.compiling import ScriptCompiles
from mcp_server.children.contract import BACKWARD_STEPS, RECORDINGS, WARMUP_PHASE
from mcp_server.children.distributed import launched_by_torchrun
from mcp_server.children.global_modules import GlobalModules
from mcp_server.children.gpu_lock import GpuPhases
from mcp_server.children.graph_capture import GraphCaptureRanges
from mcp_server.children.script_ranks import RankFacts, SpawnedRanks
from mcp_server.children.sites import UserFrames
from mcp_server.children.step_sources import BackwardSteps, NamedSteps, OptimizerSteps
from mcp_server.children.window import (
    NESTED_SHAPES_WARNING,
    UNPROFILED_BUDGET_NS,
    KernelTrace,
    MeasuredWindow,
    has_nested,
)
from mcp_server.children.window_sites import WindowSites

TRACED_WINDOWS = 2  # the timing pass's windows run again under the kernel trace (as the contract's)


class StopScript(BaseException):
    """Raised into the script once its last window is measured: the harness catches it where the script ends."""


class StepWindows:
    """The measured windows of a script, opened and closed at its step boundaries.

    After `warmup` steps, `windows` windows of `active` steps each follow back to back, then `traced` more under
    the kernel trace (the timing pass). `opens_at_start`: a window opens as its first step begins (a function or
    module call), not as the step before it ends (an optimizer step: the window then holds the loop's own code
    between steps, its data loading among it).
    """

    def __init__(self, args: Any, lock: GpuPhases, modules: GlobalModules, enter: Callable[[str], None]) -> None:
        import torch

        self.args, self.lock, self.modules, self.enter = args, lock, modules, enter
        self.warmup, self.active = args.warmup_iters, args.iters
        recording = RECORDINGS[args.profiler]
        self.profiler = "none" if recording.kernel_trace else args.profiler
        self.untraced = args.windows
        self.trace = KernelTrace(args.kineto_trace) if recording.kernel_trace else None
        self.total = self.untraced + (TRACED_WINDOWS if self.trace is not None else 0)
        self.cuda = torch.cuda.is_available()
        self.ranged = recording.ranged
        self.scoped = modules.scoped
        self.opens_at_start = True
        self.steps = 0
        self._opened_at = 0  # the steps at which the open window opened
        self._closed_at: int | None = None  # the steps at which the last window closed (the next one opens there)
        self.windows: list[dict[str, Any]] = []  # the untraced windows' times
        self.traced: list[dict[str, Any]] = []
        # without CUDA, a torch pass times more windows without the profiler once its own has closed (the
        # contract's come first; a script's steps may end at any time, so its profiled window is never put at risk)
        self.unprofiled = (args.unprofiled_windows or 0) if recording.torch_profiler and not self.cuda else 0
        self.unprofiled_timed: list[dict[str, int]] = []
        self._plain: tuple[int, int] | None = None  # the open unprofiled window: (steps, perf_counter_ns) at its start
        self.last: MeasuredWindow | None = None
        self._open: MeasuredWindow | None = None
        self.record_shapes = True  # off once a model was called with nested tensors (`window.has_nested`)
        self.closed: list[Callable[[], None]] = []  # called as each measured window closes
        self.on_start: Callable[[], None] | None = None  # each window's, once its profiler started (the ranks' line-up)
        self._frames = UserFrames() if self.ranged else None
        modules.frames = self._frames
        # entered for the whole script, on during windows: every thread the script starts (a pool of workers started
        # in the warm-up) is seen, and a compiled frame sees one mode stack throughout
        self.sites = WindowSites(self.profiler, self._frames, modules.graph_node_path, active=False) \
            if self._frames is not None else None

    def shapes_unreadable(self) -> None:
        """A model was called with nested tensors: the windows, and the threads started from now on, record their
        operators without input shapes (`window.has_nested`)."""
        self.record_shapes = False
        if self.sites is not None:
            self.sites.threads.record_shapes = False

    @property
    def measured(self) -> int:
        return len(self.windows) + len(self.traced)

    @property
    def is_open(self) -> bool:
        """A window is open now."""
        return self._open is not None

    @property
    def opened(self) -> bool:
        """A window has opened (it may have closed since)."""
        return self._open is not None or self.measured > 0

    def _due(self) -> bool:
        """A window opens at this boundary: the warm-up is over (the first window), or the window before it closed
        here."""
        if self._open is not None or self.measured >= self.total:
            return False
        return self.steps >= self.warmup if self._closed_at is None else self.steps == self._closed_at

    def step_begins(self) -> None:
        """A step is about to run."""
        if self.opens_at_start and self._due():
            self._start()
        if self.opens_at_start and self._plain_due():
            self._plain = (self.steps, time.perf_counter_ns())

    def step_ended(self) -> None:
        """A step has run: close the window its last step ends; open the next one where it opens here."""
        self.steps += 1
        if self._open is not None and self.steps == self._opened_at + self.active:
            self._close()
            self._closed_at = self.steps
            if self.measured == self.total and not self.unprofiled:
                raise StopScript
        if self._plain is not None and self.steps == self._plain[0] + self.active:
            self.unprofiled_timed.append({"wall_time_ns": time.perf_counter_ns() - self._plain[1]})
            self._plain = None
            spent = sum(w["wall_time_ns"] for w in self.unprofiled_timed)
            if len(self.unprofiled_timed) == self.unprofiled or spent > UNPROFILED_BUDGET_NS:
                raise StopScript
        if not self.opens_at_start and self._due():
            self._start()
        if not self.opens_at_start and self._plain_due():
            self._plain = (self.steps, time.perf_counter_ns())

    def _plain_due(self) -> bool:
        """An unprofiled window opens at this boundary: the profiled ones are measured, more are wanted."""
        return self._plain is None and self.measured == self.total and len(self.unprofiled_timed) < self.unprofiled

    def recount(self) -> None:
        """The steps' boundary moved before any window opened (a loop's last optimizer to step, seen stepping for
        the first time): the step now ending is the loop's first."""
        assert not self.opened
        self.steps = 0
        self.step_ended()

    def _start(self) -> None:
        self._opened_at = self.steps
        number = self.measured
        if number == 0:
            if self.trace is not None:
                self.trace.prepare()
            self.enter("waiting for the GPU lock (window)")
            self.lock.window()
            self.enter("measure")
        if self.trace is not None and number == self.untraced:
            self.trace.__enter__()
        last = number == self.total - 1
        after_start = self.on_start if RECORDINGS[self.profiler].nvtx and self.cuda else None
        if self.on_start is not None and after_start is None:  # no collection to start: lined up before the window
            self.on_start()
        window = MeasuredWindow(self.profiler, self.args.kineto_trace, on_gpu_done=self.lock.release if last else None,
                                scoped=self.scoped, record_shapes=self.record_shapes, on_start=after_start)
        window.__enter__()
        if self.sites is not None:
            self.sites.active = True
        self.modules.ranging = self.ranged
        self.modules.start_counting()
        self._open = window

    def _close(self, keep: bool = True) -> None:
        assert self._open is not None
        window = self._open
        self._open = None
        self.modules.ranging = False
        self.modules.stop_counting()
        if self.sites is not None:
            self.sites.active = False
        window.__exit__(None, None, None)
        if not keep:
            return
        timed = {"wall_time_ns": window.wall_time_ns, "gpu_elapsed_ns": window.gpu_elapsed_ns}
        if self.trace is not None and len(self.windows) >= self.untraced:
            self.traced.append(timed)
            if len(self.traced) == TRACED_WINDOWS:
                self.trace.__exit__(None, None, None)
        else:
            self.windows.append(timed)
            self.last = window
        for listener in self.closed:
            listener()

    def abandon(self) -> None:
        """The script ended with a window still open, short of its steps (the tail after an optimizer step): it is
        dropped; a kernel trace still on keeps the traced windows that ended, or is dropped when none did."""
        if self._open is not None:
            self._close(keep=False)
        if self.trace is not None and self.trace.running:
            self.trace.__exit__(None, None, None) if self.traced else self.trace.discard()


def run_steps(args: Any, result: dict[str, Any], enter: Callable[[str], None]) -> ScriptCompiles:
    """Run the script `args.workload` as `__main__` with `args.script_arg`, measuring the windows its steps choose;
    fill `result` with what the harness reports of a window. Returns what its own `torch.compile` calls compiled."""
    import torch

    if args.warmup_iters < 1 or args.iters < 1:
        raise ContractError("a script's window opens after its first step: --warmup-iters (W of --steps W:A) and "
                            "--iters must be at least 1")
    lock = GpuPhases(args.gpu_lock, args.gpu_lock_after, args.gpu_lock_done, args.warm_up_after)
    calls = _replay_calls(args.replay_calls)
    switch = (lambda on: torch.cuda.profiler.start() if on else torch.cuda.profiler.stop()) if calls else None
    modules = GlobalModules(args.profiler, calls, switch=switch).install()
    windows = StepWindows(args, lock, modules, enter)
    roots = RootCalls(modules, windows)
    captures = GraphCaptureRanges().install() if args.record_graph_capture and torch.cuda.is_available() else None
    compiles = ScriptCompiles(reuse_tuned=bool(args.warm_up_early),
                              own=(fx_graphs, global_modules, sites, launch_sites, window_sites, script_ranks,
                                   distributed))
    spawned = SpawnedRanks().install()  # a script starting its ranks itself: this process runs one
    facts = RankFacts(modules, lambda: windows.is_open) if launched_by_torchrun() else None
    if facts is not None:
        windows.closed.append(facts.window_closed)
        windows.on_start = facts.line_up
        windows.unprofiled = 0  # the ranks line their windows up: none runs on alone
    source: OptimizerSteps | BackwardSteps | NamedSteps
    if args.window_fn is None:
        source = OptimizerSteps(windows, modules)
    elif args.window_fn == BACKWARD_STEPS:
        source = BackwardSteps(windows, modules)
    else:
        source = NamedSteps(windows, modules, args.window_fn)
    enter("script")
    lock.build()
    lock.warmup(args.warm_up_early and not torch.backends.cudnn.benchmark)
    result["warmed_up_early"] = bool(args.warm_up_early)
    from mcp_server.children.clocks import ClockSampler

    clocks = ClockSampler().start() if RECORDINGS[args.profiler].kernel_trace and torch.cuda.is_available() else None
    script = Path(args.workload).resolve()
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args.script_arg]
    sys.path.insert(0, str(script.parent))  # as `python script.py` puts its folder first
    stopped, t0 = False, time.perf_counter_ns()
    enter(WARMUP_PHASE)
    try:
        with windows.sites or nullcontext():
            runpy.run_path(str(script), run_name="__main__")
    except StopScript:
        stopped = True
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise ContractError(f"the script exited with status {exc.code} after {windows.steps} step(s)") from exc
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        source.remove()
        modules.remove()
        compiles.remove()
        spawned.remove()
        if captures is not None:
            captures.remove()
            result["graph_captures"] = captures.captures
        windows.abandon()
        lock.release() if windows.measured else lock.close()
        if clocks is not None:
            clocks.stop()
            result["clocks"] = clocks.summary()
    enter("finish")
    if facts is not None:
        result["distributed"] = facts.finish()
        result["warnings"] += facts.warnings
    if spawned.spawned is not None:
        result["spawned_ranks"] = spawned.spawned
    result["warnings"] += spawned.warnings
    _report(args, result, windows, source, modules, stopped, time.perf_counter_ns() - t0)
    if (evaluated := roots.evaluated()) is not None:
        result["warnings"].append(evaluated)
    result["varying_inputs"] = roots.varying()
    if not windows.record_shapes and RECORDINGS[args.profiler].nvtx:
        result["warnings"].append(NESTED_SHAPES_WARNING)
    return compiles


class RootCalls:
    """The calls of each model (a root module) inside the measured windows: by whether autograd recorded them, and
    the shapes of their tensor arguments in each step."""

    def __init__(self, modules: GlobalModules, windows: StepWindows) -> None:
        import torch

        self._grad, self._tensor = torch.is_grad_enabled, torch.Tensor
        self.modules, self.windows = modules, windows
        self.counts: dict[str, list[int]] = {}  # root path -> [calls autograd recorded, calls without it]
        # root path -> step -> the shapes of its tensor arguments in that step's calls
        self.shapes: dict[str, dict[int, set[tuple[tuple[int, ...], ...]]]] = {}
        modules.listeners.append(self._seen)

    def _seen(self, module: Any, path: str, started: bool, args: tuple[Any, ...]) -> None:
        if not started or self.modules.inside_call():
            return
        if self.windows.record_shapes and has_nested(args):
            self.windows.shapes_unreadable()
        if self.windows.is_open:
            self.counts.setdefault(path, [0, 0])[0 if self._grad() else 1] += 1
            shapes = tuple(tuple(a.shape) for a in args if isinstance(a, self._tensor))
            self.shapes.setdefault(path, {}).setdefault(self.windows.steps, set()).add(shapes)

    def varying(self) -> dict[str, int]:
        """The models called with other shapes in one step than in another (a batch padded to its longest sentence),
        with how many shapes in all; not one whose steps each repeat the same shapes (a decode loop's prompt, then
        one token at a time)."""
        return {path: len(set().union(*steps.values())) for path, steps in self.shapes.items()
                if len({frozenset(seen) for seen in steps.values()}) > 1}

    def evaluated(self) -> str | None:
        """A warning where a model both trained and called without autograd inside the windows: an evaluation
        inside the loop, whose time the step's then holds."""
        both = {path: without for path, (recorded, without) in self.counts.items() if recorded and without}
        if not both:
            return None
        calls = ", ".join(f"{n} of {path}'s calls" for path, n in both.items())
        return (f"the measured windows hold calls of a model without autograd beside its training calls ({calls}): "
                "an evaluation inside the loop, whose time the step holds; a --steps W:A whose windows fall between "
                "evaluations measures the training steps alone")


def _report(args: Any, result: dict[str, Any], windows: StepWindows, source: Any, modules: GlobalModules,
            stopped: bool, elapsed_ns: int) -> None:
    import torch

    kind = source.kind or "function"  # a name not seen yet: counted as a function's
    result["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    result["steps"] = {"kind": kind, "name": source.name, "warmup": args.warmup_iters, "active": args.iters,
                       "seen": windows.steps, "stopped_after_window": stopped, "script_ns": elapsed_ns}
    if isinstance(source, NamedSteps) and source.where:
        result["steps"]["defined_at"] = source.where
    if windows.last is None:
        what = {"optimizer": "optimizer step() calls", "function": f"calls of {args.window_fn}",
                "module": f"calls of the {args.window_fn} module", "backward": "backward() calls"}[kind]
        found = getattr(source, "found", True)
        remedy = ("pass --window-fn NAME (a function or nn.Module class the script calls once per step), or "
                  f"--window-fn {BACKWARD_STEPS} for a training loop that updates without torch.optim"
                  if kind == "optimizer" else f"check that the script calls {args.window_fn}" if not found
                  else "lower --steps W:A")
        raise ContractError(f"the script ended after {windows.steps} {what}; its window needs "
                            f"{args.warmup_iters + args.iters} ({args.warmup_iters} to warm up): {remedy}")
    if getattr(source, "late", None):
        result["warnings"].append(
            f"{', '.join(source.late)} first stepped after the window opened: a step is one {source.name}, which may "
            "not end the loop's iteration; raise the warm-up (--steps W:A) past every optimizer's first step")
    if windows.unprofiled_timed:
        result["unprofiled_windows"] = windows.unprofiled_timed
    if windows.measured < windows.total:
        result["warnings"].append(f"the script ended after {windows.steps} steps: {windows.measured} of "
                                  f"{windows.total} windows of {args.iters} step(s) were measured")
    window = windows.last
    result["root_module"] = modules.roots[0] if modules.roots else None
    if modules.scripted:
        result["warnings"].append(
            f"{', '.join(modules.scripted)} is TorchScript (torch.jit.script): its forward runs in TorchScript's "
            "interpreter, where no module hook or call-site range runs, so its operators are named by the model and "
            "the line that called it; profile the model as Python code for its modules and lines")
    result["modules"] = modules.modules()
    result["window"] = {"wall_time_ns": window.wall_time_ns, "gpu_elapsed_ns": window.gpu_elapsed_ns,
                        "iters": args.iters}
    if window.profiler_start_ns is not None:
        result["window"]["profiler_start_ns"] = window.profiler_start_ns
        result["window"]["profiler_stop_ns"] = window.profiler_stop_ns
    if window.pinned_host_bytes is not None:
        result["window"]["pinned_host_bytes"] = window.pinned_host_bytes
    if args.windows > 1:
        result["windows"] = windows.windows
    if windows.traced:
        result["traced_windows"] = windows.traced
    if modules.started:
        result["replayed_calls"] = modules.started
    if RECORDINGS[args.profiler].torch_profiler or (windows.trace is not None and windows.trace.traced):
        result["artifacts"].append(os.path.relpath(args.kineto_trace, args.run_dir))
    elif windows.trace is not None and not windows.cuda:
        result["warnings"].append("no CUDA device: the timing pass traced no kernels")
    elif windows.trace is not None:
        needed = args.warmup_iters + windows.total * args.iters
        result["warnings"].append(f"the script ended after {windows.steps} steps, before the timing pass's traced "
                                  f"windows (it needs {needed}): no kernel times measured without the profiler; let "
                                  "the script run more steps, or lower --steps W:A")


def _replay_calls(path: Path | None) -> list[tuple[str, int]] | None:
    if path is None or not path.is_file():
        return None
    return [(str(p), int(n)) for p, n in json.loads(path.read_text(encoding="utf-8"))]
