"""Capture harness: runs one workload's measured window under the workload's own Python interpreter.

This file needs only the standard library and torch (nvtx is not required: torch.cuda.nvtx is used), so it
runs in the user's project environment. The engine starts it as a child process:

    python harness.py --workload W.py --run-dir DIR --profiler torch|nvtx|none [--compile-mode ...]

It seeds every RNG, builds the model with `get_model_and_input()`, compiles it if asked, warms up, and runs
the measured window once, writing `DIR/harness.json` (environment, window times, module table, errors) and,
per profiler: `kineto_trace.json` (torch.profiler) or nothing extra (nvtx: nsys/ncu record it from outside).
In compiled modes it also writes `inductor_provenance.json`: which aten ops and nn.Modules each generated
kernel came from, read from Inductor's own generated code and the FX graph's `nn_module_stack`.

A script without `get_model_and_input` marks its own window with `NvtxCapture` instead:

    from mcp_server.pipeline.harness import NvtxCapture
    with NvtxCapture(warmup_iters=3, warmup_fn=lambda: model(x)):
        model(x)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import re
import runpy
import shutil
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Run as a script, this file's folder leads sys.path: drop it so engine modules never shadow the stdlib.
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

MEASURE_RANGE = "operator_profiler::measure"
MODULE_RANGE_PREFIX = "module:"
HARNESS_RESULT = "harness.json"
KINETO_TRACE = "kineto_trace.json"
PROVENANCE_FILE = "inductor_provenance.json"
INDUCTOR_CODE_DIR = "inductor_code"
ENV_CONFIG = "OPERATOR_PROFILER_HARNESS"
COMPILE_MODES = ("eager", "inductor", "cudagraphs", "optimized")
# A workload defines or imports get_model_and_input (an optimized workload imports its baseline's).
CONTRACT = re.compile(
    r"^\s*(?:def get_model_and_input\b|from\s+\S+\s+import\s+.*\bget_model_and_input\b"
    r"|get_model_and_input\s*=)",
    re.MULTILINE,
)
PROFILERS = ("torch", "nvtx", "none")
QUEUE_AHEAD_MIN_NS = 50_000_000  # the GPU spins at least 50 ms while the window is enqueued
QUEUE_AHEAD_MAX_NS = 5_000_000_000

EXIT_OK, EXIT_CONTRACT, EXIT_NO_TORCH, EXIT_WORKLOAD_RAISED, EXIT_NO_WINDOW, EXIT_NOT_CACHED = 0, 2, 3, 4, 5, 6


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _config() -> dict[str, Any]:
    """The window configuration the engine passed (empty when a script runs outside the tool)."""
    raw = os.environ.get(ENV_CONFIG)
    return json.loads(raw) if raw else {}


class _Window:
    """The measured window: profiler start/stop, NVTX measure range, emit_nvtx, host wall time."""

    def __init__(
        self, profiler: str, run_dir: Path | None, queue_ahead_ns: int | None = None,
        on_gpu_done: Callable[[], None] | None = None,
    ) -> None:
        self.profiler = profiler
        self.on_gpu_done = on_gpu_done  # called once the window's GPU work is done, before the profiler stops
        self.run_dir = run_dir
        self.queue_ahead_ns = queue_ahead_ns
        self.queued_ahead: bool | None = None
        self.wall_time_ns = 0
        self.gpu_elapsed_ns: int | None = None
        self.profiler_start_ns: int | None = None
        self.profiler_stop_ns: int | None = None
        self._stack: list[Any] = []

    def __enter__(self) -> _Window:
        import torch

        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.synchronize()
        if self.profiler == "torch":
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities, record_shapes=True)
            self._prof.start()
            self._enter(torch.autograd.profiler.record_function(MEASURE_RANGE))
        elif self.profiler == "nvtx" and self.cuda:
            t0 = time.perf_counter_ns()
            torch.cuda.profiler.start()
            self.profiler_start_ns = time.perf_counter_ns() - t0  # a profiler starting its collection
            torch.cuda.nvtx.range_push(MEASURE_RANGE)
            self._enter(torch.autograd.profiler.emit_nvtx(record_shapes=True))
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            if self.queue_ahead_ns:
                # The GPU spins while the host enqueues the whole window: the events then time the window's
                # work back to back, its busy time, with none of the host's launch gaps.
                torch.cuda._sleep(_sleep_cycles(self.queue_ahead_ns))
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
            # nsys takes about 3 s to stop its collection; the next pass need not wait for that.
            self.on_gpu_done()
        while self._stack:
            self._stack.pop().__exit__(None, None, None)
        if self.profiler == "torch":
            self._prof.stop()
            if self.run_dir is not None:
                self._prof.export_chrome_trace(str(self.run_dir / KINETO_TRACE))
        elif self.profiler == "nvtx" and self.cuda:
            torch.cuda.nvtx.range_pop()
            t0 = time.perf_counter_ns()
            torch.cuda.profiler.stop()
            self.profiler_stop_ns = time.perf_counter_ns() - t0


def _sleep_cycles(ns: int) -> int:
    """GPU clock cycles for which `torch.cuda._sleep` spins about `ns` nanoseconds, calibrated on this GPU."""
    import torch

    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(ns * 10_000_000 / (start.elapsed_time(end) * 1e6))


_SCRIPT_PHASES: list[_GpuPhases] = []  # the harness's lock, handed to the script's NvtxCapture


class NvtxCapture:
    """Mark the measured window of an arbitrary script: warm up, then profile the `with` body once.

    Under `operator-profiler profile script.py` the window feeds the chosen profiler; run on its own it
    still emits `cudaProfilerStart/Stop` and the `operator_profiler::measure` NVTX range for nsys/ncu.
    """

    def __init__(self, warmup_iters: int = 3, warmup_fn: Callable[[], object] | None = None) -> None:
        cfg = _config()
        self.warmup_iters = warmup_iters
        self.warmup_fn = warmup_fn
        run_dir = cfg.get("run_dir")
        self._lock_path = Path(cfg["gpu_lock"]) if cfg.get("gpu_lock") else None
        self._lock_after = Path(cfg["gpu_lock_after"]) if cfg.get("gpu_lock_after") else None
        self._lock_done = Path(cfg["gpu_lock_done"]) if cfg.get("gpu_lock_done") else None
        self._window = _Window(cfg.get("profiler", "nvtx"), Path(run_dir) if run_dir else None,
                               on_gpu_done=self._release)

    def __enter__(self) -> NvtxCapture:
        # Under the harness, the lock it took shared while the script built its model.
        self._lock = _SCRIPT_PHASES.pop() if _SCRIPT_PHASES else _GpuPhases(
            self._lock_path, self._lock_after, self._lock_done
        )
        self._lock.warmup()
        if self.warmup_fn is not None:
            for _ in range(self.warmup_iters):
                self.warmup_fn()
        self._lock.window()
        self._window.__enter__()
        return self

    def _release(self) -> None:
        self._lock.release()

    def __exit__(self, *exc: object) -> None:
        self._window.__exit__(*exc)
        self._lock.release()
        if exc[0] is None and self._window.run_dir is not None:
            window = {"wall_time_ns": self._window.wall_time_ns, "gpu_elapsed_ns": self._window.gpu_elapsed_ns}
            _write_json(self._window.run_dir / "window.json", window)


def _seed(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def _import_compiler(compile_mode: str) -> None:
    """Import TorchDynamo (and Inductor, which every compile mode but `optimized` uses) before the first CUDA
    call: a pass started suspended at that call (ncu's launch mode) then spends these seconds while it waits,
    not after. Imported in one go they cost a pass that does not wait more than the lazy imports of a cached
    compile (on the H100's host, import, build and warm-up took 12.0 s against 10.2 s), so only asked for."""
    import torch._dynamo  # noqa: F401

    if compile_mode != "optimized":
        import torch._inductor.compile_fx  # noqa: F401


def _environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "hostname": socket.gethostname(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device_name=props.name,
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            total_memory_bytes=props.total_memory,
        )
    return env


def _load_workload(path: Path) -> Any:
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _as_call(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), inputs
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _clean_module_path(raw: str) -> str:
    """`L['self'].features._modules['0'].conv` or `L['self'].features[0]` -> `features.0.conv`."""
    path = re.sub(r"^L\['self'\]\.?", "", raw)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".")


def _record_node_modules(gm: Any, into: dict[str, dict[str, str]]) -> None:
    """FX node name -> innermost nn.Module path and type, from each node's `nn_module_stack`."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, mtype = list(stack.values())[-1]
            into[node.name] = {
                "module_path": _clean_module_path(str(path)),
                "module_type": getattr(mtype, "__name__", str(mtype)),
            }


class _RecordingBackend:
    """Wraps a workload's registered torch.compile backend so its FX graphs' module metadata is recorded."""

    def __init__(self, module: Any) -> None:
        import torch

        name = getattr(module, "BACKEND_NAME", None)
        if not name or not callable(getattr(module, "optimize", None)):
            raise _ContractError(
                "--compile-mode optimized needs BACKEND_NAME and optimize(model) (docs/optimized-workload-contract.md)"
            )
        from torch._dynamo.backends import registry

        self.node_modules: dict[str, dict[str, str]] = {}
        inner = torch._dynamo.lookup_backend(name)

        def recording(gm: Any, example_inputs: Any) -> Any:
            _record_node_modules(gm, self.node_modules)
            compiled = inner(gm, example_inputs)
            _record_node_modules(gm, self.node_modules)  # nodes the workload's own passes created in place
            return compiled

        registry._COMPILER_FNS[name] = recording
        self.optimize = module.optimize


class _RecordingInductor:
    """torch.compile backend: records each FX graph's node -> nn.Module path, then compiles with Inductor.

    With `cached_only`, a graph that Inductor's FX graph cache did not hold raises _NotCached once compiled,
    before any of it runs: its Triton kernels would autotune in this pass instead of reusing the configurations
    the previous pass chose."""

    def __init__(self, compile_mode: str, cached_only: bool = False) -> None:
        self.compile_mode = compile_mode
        self.cached_only = cached_only
        self.node_modules: dict[str, dict[str, str]] = {}

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.utils import counters
        from torch._inductor.compile_fx import compile_fx

        _record_node_modules(gm, self.node_modules)
        patches = {"triton.cudagraphs": True} if self.compile_mode == "cudagraphs" else None
        before = dict(counters["inductor"])
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
        grew = {key: counters["inductor"].get(key, 0) - before.get(key, 0)
                for key in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")}
        if self.cached_only and (grew["fxgraph_cache_miss"] or grew["fxgraph_cache_bypass"]
                                 or not grew["fxgraph_cache_hit"]):
            raise _NotCached(f"Inductor's FX graph cache did not hold a graph of {len(gm.graph.nodes)} nodes ({grew})")
        return compiled


class _NotCached(Exception):
    """A graph was compiled afresh in a pass that may only reuse Inductor's cache (--compile-early-if-cached)."""


def _not_cached(exc: BaseException) -> _NotCached | None:
    """The _NotCached behind `exc`, which Dynamo wraps (BackendCompilerFailed keeps it as inner_exception)."""
    for _ in range(8):  # a bounded walk down the chain
        if exc is None or isinstance(exc, _NotCached):
            return exc
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None


def _inductor_provenance(backend: _RecordingInductor | _RecordingBackend, run_dir: Path) -> dict[str, Any]:
    """Copy every module Inductor generated in this process into the run directory, with the FX metadata.

    The engine reads the copies (kernel name -> original aten ops) and `node_modules` (FX node -> module
    path) to attribute generated kernels; nothing here depends on the generated code's format.
    """
    from torch._inductor.codecache import PyCodeCache

    dest = run_dir / INDUCTOR_CODE_DIR
    dest.mkdir(exist_ok=True)
    copied = []
    for module in list(PyCodeCache.modules):
        source = getattr(module, "__file__", None)
        if source and os.path.exists(source):
            name = f"{len(copied):03d}_{Path(source).name}"
            shutil.copyfile(source, dest / name)
            copied.append(f"{INDUCTOR_CODE_DIR}/{name}")
    return {"node_modules": backend.node_modules, "generated_code": copied}


class _ModuleRanges:
    """Forward pre/post hooks that wrap every submodule's forward in a `module:<path>` range (eager only)."""

    def __init__(self, model: Any, profiler: str) -> None:
        import torch

        self._torch = torch
        self.profiler = profiler
        self._open: list[Any] = []
        self._handles = []
        for path, module in model.named_modules():
            if path:
                self._handles.append(module.register_forward_pre_hook(self._pre(path)))
                self._handles.append(module.register_forward_hook(self._post))

    def _pre(self, path: str) -> Callable[..., None]:
        name = MODULE_RANGE_PREFIX + path

        def hook(module: Any, args: Any) -> None:
            if self.profiler == "torch":
                ctx = self._torch.autograd.profiler.record_function(name)
                ctx.__enter__()
                self._open.append(ctx)
            else:
                self._torch.cuda.nvtx.range_push(name)

        return hook

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.profiler == "torch":
            if self._open:
                self._open.pop().__exit__(None, None, None)
        else:
            self._torch.cuda.nvtx.range_pop()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _describe_placement(model: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    import torch

    param_devices = sorted({str(p.device) for p in model.parameters()}) if hasattr(model, "parameters") else []
    input_devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
    return {"parameter_devices": param_devices, "input_devices": input_devices}


class _GpuPhases:
    """The passes of one run (nsys, ncu, ncu's shape variants) take the GPU in turn, through one lock file.

    Building the model takes the lock shared at once. A pass given `after` compiles and warms up only once
    that file exists: the previous pass's window is done, and the Triton configurations it autotuned are in
    Inductor's cache, so every pass runs the same kernels (autotuning under ncu would time configurations
    differently). Compiling and warming up take the lock shared, the window takes it exclusively; a pass given
    `done` writes that file after its window. An `early` pass (its compile may only reuse Inductor's cache, so
    nothing autotunes in it) compiles and warms up at once; only its window waits for `after`.
    """

    def __init__(
        self, path: Path | None, after: Path | None = None, done: Path | None = None, early: bool = False
    ) -> None:
        self._path, self._after, self._done, self._early = path, after, done, early
        self._file: Any = None

    def build(self) -> None:
        """Take the lock shared: build the model while no other pass measures."""
        if self._file is None:
            self._take("LOCK_SH")

    def warmup(self) -> None:
        """Wait for the previous pass's window (not holding the lock), then take it shared: compile, warm up.
        An `early` pass does not wait: it compiles from Inductor's cache only, so nothing autotunes in it."""
        if not self._early:
            self._wait_for_after()
        self.build()

    def window(self) -> None:
        """Take the lock exclusively for the measured window (an `early` pass after the previous pass's)."""
        self._wait_for_after()
        self._drop()
        self._take("LOCK_EX")

    def _wait_for_after(self) -> None:
        if self._after is not None and not self._after.exists():
            self._drop()
            while not self._after.exists():
                time.sleep(0.05)

    def release(self) -> None:
        """Drop the lock and mark this pass's window done."""
        held = self._file is not None
        self._drop()
        if held and self._done is not None:
            self._done.touch()

    def close(self) -> None:
        """Drop the lock without marking a window done (the script never opened one)."""
        self._drop()

    def _take(self, mode: str) -> None:
        if self._path is None:
            return
        import fcntl

        self._file = open(self._path, "a+")  # noqa: SIM115 - held across phases, closed in _drop()
        fcntl.flock(self._file.fileno(), getattr(fcntl, mode))

    def _drop(self) -> None:
        if self._file is not None:
            import fcntl

            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def run_contract(module: Any, args: argparse.Namespace, result: dict[str, Any], run_dir: Path) -> None:
    """Build, compile, warm up and measure a `get_model_and_input()` workload."""
    import torch

    if torch.cuda.is_available() and args.gpu_lock is not None:
        # The CUDA context is created before the lock: an allocation runs nothing on the GPU, so it need not
        # wait while another pass measures (under ncu it takes seconds).
        _enter(result, "cuda context")
        torch.empty(1, device="cuda")
    _enter(result, "waiting for the GPU lock (build)")
    lock = _GpuPhases(args.gpu_lock, args.gpu_lock_after, args.gpu_lock_done, args.compile_early_if_cached)
    lock.build()
    _enter(result, "build")
    model, inputs = module.get_model_and_input()
    call_args, call_kwargs = _as_call(inputs)
    result["placement"] = _describe_placement(model, call_args)
    if torch.cuda.is_available() and "cpu" in result["placement"]["parameter_devices"] + result["placement"][
        "input_devices"
    ]:
        result["warnings"].append(
            "CUDA is available but part of the model or inputs is on the CPU: "
            f"{result['placement']}; move them to 'cuda' in get_model_and_input()"
        )
    train_step = getattr(module, "train_step", None) if args.train_step else None
    if args.train_step and train_step is None:
        raise _ContractError("--train-step was given but the workload defines no train_step(model, inputs)")
    backend = None
    fn = model
    if args.compile_mode == "optimized":
        backend = _RecordingBackend(module)
        fn = backend.optimize(model)
    elif args.compile_mode != "eager":
        backend = _RecordingInductor(args.compile_mode, cached_only=args.compile_early_if_cached)
        fn = torch.compile(model, backend=backend)

    def step() -> None:
        if train_step is not None:
            train_step(fn, inputs)
        else:
            with torch.no_grad():
                fn(*call_args, **call_kwargs)

    _enter(result, "waiting for the previous pass")
    lock.warmup()
    _enter(result, "warmup")
    t0 = time.perf_counter_ns()
    last_step_ns = 0
    for _ in range(args.warmup_iters):
        t_step = time.perf_counter_ns()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        last_step_ns = time.perf_counter_ns() - t_step
    result["warmup_time_ns"] = time.perf_counter_ns() - t0
    _enter(result, "waiting for the GPU lock (window)")
    lock.window()
    hooks = _ModuleRanges(model, args.profiler) if args.compile_mode == "eager" and args.profiler != "none" else None
    _enter(result, "measure")
    queue_ahead_ns = None
    if args.queue_ahead and torch.cuda.is_available():
        queue_ahead_ns = min(max(QUEUE_AHEAD_MIN_NS, 4 * last_step_ns * args.iters), QUEUE_AHEAD_MAX_NS)
    window = _Window(args.profiler, run_dir, queue_ahead_ns, on_gpu_done=lock.release)
    replay = _capture_graph(step) if args.graph_replay and torch.cuda.is_available() else None
    if isinstance(replay, str):
        result["warnings"].append(f"--graph-replay: the window could not be captured in a CUDA graph: {replay}")
    with window:
        for _ in range(args.iters):
            replay() if callable(replay) else step()
    _enter(result, "finish")
    if hooks is not None:
        hooks.remove()
    lock.release()
    result["window"] = {
        "wall_time_ns": window.wall_time_ns, "gpu_elapsed_ns": window.gpu_elapsed_ns, "iters": args.iters
    }
    if window.profiler_start_ns is not None:
        result["window"]["profiler_start_ns"] = window.profiler_start_ns
        result["window"]["profiler_stop_ns"] = window.profiler_stop_ns
    if queue_ahead_ns is not None:
        result["window"]["queued_ahead"] = window.queued_ahead
    if args.graph_replay:
        result["window"]["graph_replay"] = callable(replay)
    result["modules"] = {path: type(m).__name__ for path, m in model.named_modules() if path}
    if backend is not None:
        _write_json(run_dir / PROVENANCE_FILE, _inductor_provenance(backend, run_dir))
        result["artifacts"].append(PROVENANCE_FILE)
    if args.profiler == "torch":
        result["artifacts"].append(KINETO_TRACE)


def _capture_graph(step: Callable[[], None]) -> Callable[[], None] | str:
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
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    torch.cuda.synchronize()
    return graph.replay


def _run_script(args: argparse.Namespace) -> None:
    """Run an NvtxCapture script; the code before its window builds under the GPU lock, taken shared."""
    import mcp_server.pipeline.harness as importable  # the module the script's NvtxCapture comes from

    phases = importable._GpuPhases(args.gpu_lock, args.gpu_lock_after, args.gpu_lock_done)
    phases.build()
    importable._SCRIPT_PHASES[:] = [phases]
    try:
        runpy.run_path(str(args.workload), run_name="__main__")
    finally:
        importable._SCRIPT_PHASES.clear()
        phases.close()


def _enter(result: dict[str, Any], phase: str) -> None:
    """Move to the next phase; harness.json keeps when each phase began (epoch seconds)."""
    result["phase"] = phase
    result["phase_started_at"][phase] = round(time.time(), 3)


class _ContractError(Exception):
    pass


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler capture harness (runs one measured window).")
    parser.add_argument("--workload", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--profiler", choices=PROFILERS, default="none")
    parser.add_argument("--compile-mode", choices=COMPILE_MODES, default="eager")
    parser.add_argument("--warmup-iters", type=int, default=3)
    parser.add_argument("--iters", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-step", action="store_true")
    parser.add_argument("--gpu-lock", type=Path,
                        help="lock file: shared while building and warming up, exclusive for the window")
    parser.add_argument("--gpu-lock-after", type=Path,
                        help="compile, warm up and measure only once this file exists (the previous pass's "
                             "window is done)")
    parser.add_argument("--gpu-lock-done", type=Path, help="file written once this pass's window is done")
    parser.add_argument("--queue-ahead", action="store_true",
                        help="(--profiler none) let the GPU spin while the window is enqueued, so the CUDA events "
                             "time its busy time without host launch gaps")
    parser.add_argument("--graph-replay", action="store_true",
                        help="(--profiler none) run the window as replays of one iteration captured in a CUDA "
                             "graph, so the CUDA events time its kernels with the GPU's smallest launch gaps")
    parser.add_argument("--import-compiler-early", action="store_true",
                        help="import TorchDynamo/Inductor before the first CUDA call (a pass started suspended at "
                             "that call imports them while it waits)")
    parser.add_argument("--compile-early-if-cached", action="store_true",
                        help="compile and warm up without waiting for --gpu-lock-after (the window still waits), "
                             f"from Inductor's cache only: exit with code {EXIT_NOT_CACHED} before running a graph "
                             "the cache did not hold")
    parser.add_argument("--script-arg", action="append", default=[], help="argument passed to a script workload")
    args = parser.parse_args(argv)
    if args.queue_ahead and args.profiler != "none":
        parser.error("--queue-ahead times the window without a profiler: use it with --profiler none")
    if args.graph_replay and args.profiler != "none":
        parser.error("--graph-replay times the window without a profiler: use it with --profiler none")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the workload's window; write harness.json whatever happens; return the exit code."""
    args = _parse_args(argv)
    run_dir = args.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "status": "running",
        "phase": "import",
        "phase_started_at": {"import": round(time.time(), 3)},
        "workload": str(args.workload),
        "profiler": args.profiler,
        "compile_mode": args.compile_mode,
        "run_mode": "train_step" if args.train_step else "inference",
        "warmup_iters": args.warmup_iters,
        "iters": args.iters,
        "seed": args.seed,
        "started_at": _now(),
        "warnings": [],
        "artifacts": [],
    }
    code = EXIT_OK
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        message = f"{sys.executable} cannot import torch: {exc}"
        result.update(status="error", error={"kind": "no_torch", "message": message})
        _write_json(run_dir / HARNESS_RESULT, result)
        return EXIT_NO_TORCH
    if args.import_compiler_early and args.compile_mode != "eager":
        _enter(result, "compiler import")
        _import_compiler(args.compile_mode)
    _enter(result, "setup")
    result["environment"] = _environment()
    _seed(args.seed)
    os.environ[ENV_CONFIG] = json.dumps(
        {
            "profiler": args.profiler, "run_dir": str(run_dir), "gpu_lock": str(args.gpu_lock or ""),
            "gpu_lock_after": str(args.gpu_lock_after or ""), "gpu_lock_done": str(args.gpu_lock_done or ""),
        }
    )
    try:
        module_source = args.workload.read_text(encoding="utf-8")
        if CONTRACT.search(module_source):
            result["workload_kind"] = "contract"
            module = _load_workload(args.workload.resolve())
            if not callable(getattr(module, "get_model_and_input", None)):
                raise _ContractError(f"{args.workload} defines no callable get_model_and_input()")
            run_contract(module, args, result, run_dir)
        elif re.search(r"\bNvtxCapture\s*\(", module_source):
            result["workload_kind"] = "script"
            _enter(result, "script")
            sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
            sys.argv = [str(args.workload), *args.script_arg]
            _run_script(args)
            window_file = run_dir / "window.json"
            if not window_file.exists():
                raise _ContractError(f"{args.workload} finished without closing an NvtxCapture window")
            result["window"] = {**json.loads(window_file.read_text()), "iters": 1}
            if args.profiler == "torch":
                result["artifacts"].append(KINETO_TRACE)
        else:
            raise _ContractError(
                f"{args.workload} defines no get_model_and_input() and uses no NvtxCapture window"
            )
        result["status"] = "ok"
    except _ContractError as exc:
        result.update(status="error", error={"kind": "contract", "message": str(exc)})
        code = EXIT_CONTRACT
    except BaseException as exc:  # noqa: BLE001 - the workload's own failure is reported, not re-raised
        if (not_cached := _not_cached(exc)) is not None:
            result.update(status="error", error={"kind": "not_cached", "message": str(not_cached)})
            code = EXIT_NOT_CACHED
        else:
            tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
            result.update(
                status="error",
                error={"kind": "workload_raised", "message": f"{type(exc).__name__}: {exc}", "traceback_tail": tail},
            )
            code = EXIT_WORKLOAD_RAISED
    result["finished_at"] = _now()
    _write_json(run_dir / HARNESS_RESULT, result)
    return code


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (CUDA/Inductor shutdown takes seconds); every result is already on disk.
    os._exit(exit_code)
