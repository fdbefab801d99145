"""Capture harness: runs one workload's measured window under the workload's own Python interpreter.

Standard library and torch only (nvtx is not required: torch.cuda.nvtx is used), so it runs in the user's
project environment. The engine starts it as a child process:

    python harness.py --workload W.py --run-dir DIR --result DIR/harness.json --profiler torch|nvtx|kernels|none
        [--kineto-trace FILE] [--provenance FILE] [--compile-mode ...]

It seeds every RNG, builds the model with `get_model_and_input()`, compiles it if asked, warms up, and runs the
measured window, writing `--result` (environment, window times, module table, errors) whatever happens and, with the
torch profiler, the Kineto trace at `--kineto-trace` (nvtx: nsys/ncu record it from outside). The no-profiler timing
pass (`--profiler kernels --windows K`) measures the window K times with no NVTX, no hooks, no operator recording and
no tracing (`windows`), then twice more while CUPTI alone records the kernels (a Kineto trace of CUDA activity only;
`traced_windows`): CUPTI's launch callbacks slow the host, so the window's time comes from the untraced windows and
the kernels' durations and gaps from the traced ones. In compiled modes it writes `--provenance`: which aten ops and
nn.Modules each generated kernel came from, with a copy of Inductor's generated code beside it. A script without
`get_model_and_input` marks its own window with `NvtxCapture` (mcp_server/children/script.py); with `--run-script` any
script runs unmodified, its window chosen by its own steps (mcp_server/children/steps.py, step_sources.py).
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - this package importable, this folder off sys.path

import argparse
import json
import os
import sys
import time
import traceback
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

from mcp_server.children.clocks import ClockSampler
from mcp_server.children.common import (
    ContractError,
    as_call,
    cannot_write,
    environment,
    inputs_preparer,
    load_workload,
    model_and_inputs,
    now,
    recipe_of,
    seed_all,
    traceback_tail,
    write_json,
)
from mcp_server.children.compiling import (
    SKIPPED,
    GraphRecorder,
    RecordingBackend,
    RecordingInductor,
    SkippedFunctions,
    import_compiler,
    inductor_provenance,
)
from mcp_server.children.contract import (
    CANNOT_WRITE,
    CANNOT_WRITE_LINE,
    CONTRACT,
    CONTRACT_ERROR,
    EXIT_CANNOT_WRITE,
    EXIT_CONTRACT,
    EXIT_NO_TORCH,
    EXIT_NOT_CACHED,
    EXIT_OK,
    EXIT_WORKLOAD_RAISED,
    NO_TORCH,
    NOT_CACHED,
    OUT_OF_MEMORY,
    PHASE_MARKER,
    RECORDINGS,
    SCRIPT_WINDOW,
    WARMUP_PHASE,
    WORKLOAD_RAISED,
    harness_parser,
    recipe_parts,
)
from mcp_server.children.cpu_share import hold_to_share
from mcp_server.children.distributed import (
    DdpForwards,
    WindowLineUp,
    ddp_buckets,
    expand_rank,
    finish,
    init_process_group,
    launched_by_torchrun,
    wrap,
)
from mcp_server.children.gpu_lock import GpuPhases
from mcp_server.children.graph_capture import GraphCaptureRanges
from mcp_server.children.inductor_cache import not_cached
from mcp_server.children.memory import capture_memory, memory_step, memory_window, out_of_memory, watch
from mcp_server.children.naming import root_module_name, traced_classes
from mcp_server.children.pinned import PageableBatches
from mcp_server.children.recipe import RecordingRecipe
from mcp_server.children.script import run_script
from mcp_server.children.sites import GradientHooks, UserFrames
from mcp_server.children.steps import run_steps
from mcp_server.children.window import (
    NESTED_SHAPES_WARNING,
    KernelTrace,
    MeasuredWindow,
    ModuleRanges,
    ProfiledCalls,
    capture_graph,
    has_nested,
    unprofiled_windows,
)
from mcp_server.children.window_sites import WindowSites

QUEUE_AHEAD_MIN_NS = 50_000_000  # the GPU spins at least 50 ms while the window is enqueued
QUEUE_AHEAD_MAX_NS = 5_000_000_000
WINDOW_FILE = ".window.json"  # where a script's NvtxCapture leaves its window's times for the harness


def _describe_placement(model: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    import torch

    param_devices = sorted({str(p.device) for p in model.parameters()}) if hasattr(model, "parameters") else []
    input_devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
    return {"parameter_devices": param_devices, "input_devices": input_devices}


def _artifact(path: Path, run_dir: Path) -> str:
    """An artifact's path as harness.json lists it: relative to the pass directory."""
    return os.path.relpath(path, run_dir)


def _record_graphs(args: argparse.Namespace, result: dict[str, Any], recorder: GraphRecorder,
                   waited_for_tuning: list[str]) -> None:
    """The compiled graphs into harness.json (graph breaks, kernels that waited for another pass's tuning) and the
    provenance file beside it."""
    result["graph_breaks"] = recorder.graph_breaks
    result["cuda_graph_trees"] = recorder.cuda_graph_trees
    if waited_for_tuning:
        result["waited_for_tuned_configurations"] = waited_for_tuning
    write_json(args.provenance, inductor_provenance(recorder, args.provenance.parent))
    result["artifacts"].append(_artifact(args.provenance, args.run_dir))


def run_contract(module: Any, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Build, compile, warm up and measure a `get_model_and_input()` workload."""
    import torch

    recording = RECORDINGS[args.profiler]
    ranks = launched_by_torchrun()
    if ranks:  # before anything touches the GPU: this rank's device is its local rank's
        _enter(result, "process group")
        result["distributed"] = init_process_group(args.dist_backend)
    if torch.cuda.is_available() and args.gpu_lock is not None:
        # The CUDA context is created before the lock: an allocation runs nothing on the GPU, so it need not
        # wait while another pass measures (under ncu it takes seconds).
        _enter(result, "cuda context")
        torch.empty(1, device="cuda")
    captures = (GraphCaptureRanges(eager=args.compile_mode == "eager").install()
                if args.record_graph_capture and torch.cuda.is_available() else None)
    _enter(result, "waiting for the GPU lock (build)")
    lock = GpuPhases(args.gpu_lock, args.gpu_lock_after, args.gpu_lock_done, args.warm_up_after)
    lock.build()
    _enter(result, "build")
    gradient_hooks = GradientHooks().install() if recording.ranged else None  # the hooks it registers: their lines
    model, inputs = model_and_inputs(module.get_model_and_input())
    if captures is not None:
        captures.watch(model)
    call_args, call_kwargs = as_call(inputs)
    result["placement"] = _describe_placement(model, call_args)
    if torch.cuda.is_available() and "cpu" in result["placement"]["parameter_devices"] + result["placement"][
        "input_devices"
    ]:
        result["warnings"].append(
            "CUDA is available but part of the model or inputs is on the CPU: "
            f"{result['placement']}; move them to 'cuda' in get_model_and_input()"
        )
    # Warming up beside another pass's window is safe only when nothing in it times alternatives: cuDNN's
    # autotuner (which the workload may turn on while it builds) would time them against that pass's kernels.
    early = args.warm_up_early and not torch.backends.cudnn.benchmark
    result["warmed_up_early"] = early
    train_step = getattr(module, "train_step", None) if args.train_step else None
    if args.train_step and train_step is None:
        raise ContractError("--train-step was given but the workload defines no train_step(model, inputs)")
    backend: RecordingBackend | RecordingInductor | None = None
    result["root_module"] = root_module_name(model)
    # an optimized workload applying an eager recipe runs its model eagerly: module and site ranges as in eager mode
    recipe = recipe_of(module) if args.compile_mode == "optimized" else None
    eager = args.compile_mode == "eager" or (recipe is not None and recipe_parts(recipe)[0] == "eager")
    watch(model, inputs, result["root_module"], "eager" if eager else args.compile_mode)
    wrapper = getattr(module, "DISTRIBUTED", None) if ranks else None
    wrapped = wrap(model, wrapper)  # the module ranges keep the model's own paths; DDP runs it
    forwards = DdpForwards().watch(wrapped if eager else None)  # the iterations DDP times (waiting for their events)
    fn = wrapped
    if recipe is not None:
        backend = RecordingRecipe(module, result["root_module"])
        fn = backend.optimize(fn)
    elif args.compile_mode == "optimized":
        backend = RecordingBackend(module, result["root_module"])
        fn = backend.optimize(fn)
    if args.compile_mode == "optimized":  # its inputs as its prepare_inputs turns them, before the window
        inputs = inputs_preparer(module)(inputs)
        call_args, call_kwargs = as_call(inputs)
    elif args.compile_mode != "eager":
        backend = RecordingInductor(args.compile_mode, result["root_module"],
                                    cached_only=early,
                                    cpu_kernel_ranges=recording.torch_profiler and not torch.cuda.is_available())
        fn = torch.compile(fn, backend=backend)

    def step() -> None:
        if train_step is not None:
            train_step(fn, inputs)
        else:
            with torch.no_grad():
                fn(*call_args, **call_kwargs)

    step = memory_step(step)
    _enter(result, "waiting for the previous pass")
    lock.warmup(early)
    clocks = ClockSampler().start() if recording.kernel_trace and torch.cuda.is_available() else None
    _enter(result, WARMUP_PHASE)
    t0 = time.perf_counter_ns()
    last_step_ns = 0
    with SkippedFunctions(backend.graph_breaks) if isinstance(backend, RecordingInductor) else nullcontext():
        for _ in range(args.warmup_iters):
            t_step = time.perf_counter_ns()
            step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            last_step_ns = time.perf_counter_ns() - t_step
    result["warmup_time_ns"] = time.perf_counter_ns() - t0
    # our own torch.compile of the model (a recipe's optimize(model) wraps more than its compile: autocast, casts)
    ours = backend if isinstance(backend, RecordingInductor) and not isinstance(backend, RecordingRecipe) else None
    if ours is not None and not ours.graphs:
        # Dynamo skipped every function it met, so the model ran eagerly. The window runs it without the compiled
        # wrapper (whose frame hook, under the module ranges, would trace again), recorded as an eager one is.
        eager, fn = True, wrapped
        skipped = ", ".join(f"{b['location']} ({b['reason'].removesuffix(SKIPPED)})" for b in ours.graph_breaks)
        result["warnings"].append(
            "torch.compile compiled no graph: Dynamo ran the model eagerly"
            + (f", after graph breaks it could not handle at {skipped}" if skipped else "")
            + "; the window runs the model without torch.compile's wrapper (its per-call frame checks not timed), "
            "with module ranges and call sites as in eager mode")
    result["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    if args.unprofiled_windows and not torch.cuda.is_available():  # a GPU's run has its timing pass for this
        _enter(result, "unprofiled windows")
        result["unprofiled_windows"] = unprofiled_windows(step, args.iters, args.unprofiled_windows)
    trace = KernelTrace(args.kineto_trace) if recording.kernel_trace else None
    if trace is not None:
        trace.prepare()  # its imports now, while the previous pass may still measure, not in this window's turn
    _enter(result, "waiting for the GPU lock (window)")
    lock.window()
    # The ranks enter the window together: at its start, or under nsys once each rank's collection has started
    # (its start takes a different time on each rank: the first collective would wait out the difference).
    line_up = WindowLineUp(result["warnings"]) if ranks else None
    after_start = line_up if line_up is not None and recording.nvtx and torch.cuda.is_available() else None
    if line_up is not None and after_start is None:
        _enter(result, "barrier")
        line_up()
    ranged = eager and recording.ranged
    hooks = ModuleRanges(model, args.profiler, result["root_module"]) if ranged else None
    frames = UserFrames() if ranged else None
    scoped = _profiled_calls(args, model, result["root_module"]) if ranged and recording.nvtx else None
    _enter(result, "measure")
    queue_ahead_ns = None
    if args.queue_ahead and torch.cuda.is_available():
        queue_ahead_ns = min(max(QUEUE_AHEAD_MIN_NS, 4 * last_step_ns * args.iters), QUEUE_AHEAD_MAX_NS)
    replay = capture_graph(step) if args.graph_replay and torch.cuda.is_available() else None
    if isinstance(replay, str):
        result["warnings"].append(f"--graph-replay: the window could not be captured in a CUDA graph: {replay}")
    shapes = not has_nested((call_args, call_kwargs))  # torch's NVTX ranges cannot read a jagged tensor's sizes
    if not shapes and recording.nvtx:
        result["warnings"].append(NESTED_SHAPES_WARNING)

    def measure(count: int, release: bool) -> tuple[list[dict[str, int | None]], MeasuredWindow]:
        timed = []
        for number in range(count):
            last = release and number == count - 1
            window = MeasuredWindow("none" if recording.kernel_trace else args.profiler, args.kineto_trace,
                                    queue_ahead_ns, on_gpu_done=lock.release if last else None,
                                    scoped=scoped is not None, on_start=after_start, record_shapes=shapes)
            with window, ExitStack() as traced:
                traced.enter_context(memory_window())
                traced.enter_context(forwards.inside())
                if frames is not None and hooks is not None:  # every thread's operators and lines
                    traced.enter_context(WindowSites(args.profiler, frames, hooks.graph_node_path, shapes))
                for _ in range(args.iters):
                    replay() if callable(replay) else step()
            timed.append({"wall_time_ns": window.wall_time_ns, "gpu_elapsed_ns": window.gpu_elapsed_ns})
        return timed, window

    if trace is None:
        windows, window = measure(args.windows, release=True)
    else:  # the window's own time untraced; then its kernels under CUPTI, whose launch callbacks slow the host
        windows, window = measure(args.windows, release=False)
        with trace:
            result["traced_windows"], _ = measure(TRACED_WINDOWS, release=True)
    if clocks is not None:  # sampled through the warm-up and the windows: the clocks the window's work runs at
        clocks.stop()
        result["clocks"] = clocks.summary()
    _enter(result, "finish")
    if ranks:  # DDP rebuilds its buckets in its second iteration: the window's are known now
        result["distributed"]["wrapped_by"] = wrapper
        result["distributed"]["ddp_buckets"] = ddp_buckets(wrapped, result["root_module"], wrapped=wrapper is not None)
        result["distributed"]["ddp_timed_iterations"] = forwards.timed
    for installed in (hooks, gradient_hooks):
        if installed is not None:
            installed.remove()
    if scoped is not None:
        scoped.remove()
        result["replayed_calls"] = scoped.started
    lock.release()
    result["window"] = dict(wall_time_ns=window.wall_time_ns, gpu_elapsed_ns=window.gpu_elapsed_ns, iters=args.iters)
    if window.profiler_start_ns is not None:
        result["window"]["profiler_start_ns"] = window.profiler_start_ns
        result["window"]["profiler_stop_ns"] = window.profiler_stop_ns
    if window.pinned_host_bytes is not None:
        result["window"]["pinned_host_bytes"] = window.pinned_host_bytes
    if queue_ahead_ns is not None:
        result["window"]["queued_ahead"] = window.queued_ahead
    if args.graph_replay:
        result["window"]["graph_replay"] = callable(replay)
    if args.windows > 1:
        result["windows"] = windows
    result["modules"] = {path: type(m).__name__ for path, m in model.named_modules() if path}
    result["modules"].update((path, name) for path, name in traced_classes(model).items()  # an exported program's
                             if result["modules"].get(path) in (None, "Module"))
    if captures is not None:  # the CUDA graphs the workload captured, recorded with their ranges
        captures.remove()
        result["graph_captures"] = captures.captures
    if backend is not None:
        waited: list[str] = []
        if isinstance(backend, RecordingInductor):
            result["graphs_from_aot_cache"] = backend.reused_graphs
            waited = backend.waited_for_tuning
        _record_graphs(args, result, backend, waited)
    if recording.torch_profiler or (trace is not None and trace.traced):
        result["artifacts"].append(_artifact(args.kineto_trace, args.run_dir))
    elif trace is not None:
        result["warnings"].append("no CUDA device: the timing pass traced no kernels")


TRACED_WINDOWS = 2  # windows of the timing pass run again under the kernel trace, for busy time and gaps


def _run_script_workload(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Run an NvtxCapture script; the code before its window builds under the GPU lock, taken shared."""
    _enter(result, "script")
    window_file = args.run_dir / WINDOW_FILE
    window_file.unlink(missing_ok=True)
    config = {
        "profiler": args.profiler, "window_file": str(window_file), "kineto_trace": str(args.kineto_trace or ""),
        "gpu_lock": str(args.gpu_lock or ""), "gpu_lock_after": str(args.gpu_lock_after or ""),
        "gpu_lock_done": str(args.gpu_lock_done or ""),
    }
    run_script(args.workload, args.script_arg, config, GpuPhases(args.gpu_lock, args.gpu_lock_after,
                                                                   args.gpu_lock_done))
    if not window_file.exists():
        raise ContractError(f"{args.workload} finished without closing an NvtxCapture window")
    result["window"] = {**json.loads(window_file.read_text(encoding="utf-8")), "iters": 1}
    if RECORDINGS[args.profiler].torch_profiler:
        result["artifacts"].append(_artifact(args.kineto_trace, args.run_dir))


def _profiled_calls(args: argparse.Namespace, model: Any, root: str) -> ProfiledCalls | None:
    """The module calls a replay wants profiled (`--replay-calls`), if the engine wrote them before the window."""
    if args.replay_calls is None or not args.replay_calls.is_file():
        return None
    calls = [(str(path), int(number)) for path, number in json.loads(args.replay_calls.read_text(encoding="utf-8"))]
    return ProfiledCalls(model, root, calls)


def _enter(result: dict[str, Any], phase: str) -> None:
    """Move to the next phase: said on stdout for the engine's progress, kept in harness.json with when each
    phase began (epoch seconds)."""
    result["phase"] = phase
    result["phase_started_at"][phase] = round(time.time(), 3)
    rank = f" (rank {os.environ['RANK']})" if launched_by_torchrun() else ""
    print(f"{PHASE_MARKER}{phase}{rank}", flush=True)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = harness_parser()  # the flags' table, which the engine writes the command line from
    args = parser.parse_args(argv)
    for name in ("run_dir", "result", "kineto_trace", "provenance"):  # each rank its own folder: %q{RANK}
        setattr(args, name, expand_rank(getattr(args, name)))
    if args.queue_ahead and args.profiler != "none":
        parser.error("--queue-ahead times the window without a profiler: use it with --profiler none")
    if args.graph_replay and args.profiler != "none":
        parser.error("--graph-replay times the window without a profiler: use it with --profiler none")
    if RECORDINGS[args.profiler].kineto and args.kineto_trace is None:
        parser.error(f"--profiler {args.profiler} needs --kineto-trace FILE")
    if args.windows < 1:
        parser.error("--windows must be at least 1")
    if args.compile_mode != "eager" and args.provenance is None:
        parser.error(f"--compile-mode {args.compile_mode} needs --provenance FILE")
    args.run_dir = args.run_dir.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the workload's window; write the result whatever happens; return the exit code."""
    args = _parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
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
        "started_at": now(),
        "warnings": [],
        "artifacts": [],
    }
    code = EXIT_OK
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        message = f"{sys.executable} cannot import torch: {exc}"
        result.update(status="error", error={"kind": NO_TORCH, "message": message})
        write_json(args.result, result)
        return EXIT_NO_TORCH
    if args.import_compiler_early and args.compile_mode != "eager":
        _enter(result, "compiler import")
        import_compiler(args.compile_mode)
    _enter(result, "setup")
    result["cpu_threads"] = hold_to_share(args.cpu_threads)
    result["environment"] = environment()
    seed_all(args.seed)
    pageable = PageableBatches().install() if args.pageable_batches else None
    try:
        source = args.workload.read_text(encoding="utf-8")
        if args.run_script:  # a plain script, unmodified: its own steps choose the window
            result["workload_kind"] = "steps"
            compiles = run_steps(args, result, lambda phase: _enter(result, phase))
            if compiles.recorder is not None and args.provenance is not None:  # the script compiled its model
                _record_graphs(args, result, compiles.recorder, compiles.waited_for_tuning)
        elif CONTRACT.search(source):
            result["workload_kind"] = "contract"
            module = load_workload(args.workload)
            if not callable(getattr(module, "get_model_and_input", None)):
                raise ContractError(f"{args.workload} defines no callable get_model_and_input()")
            with capture_memory(RECORDINGS[args.profiler].memory, args.run_dir, result):
                run_contract(module, args, result)
        elif SCRIPT_WINDOW.search(source):
            result["workload_kind"] = "script"
            _run_script_workload(args, result)
        else:
            raise ContractError(f"{args.workload} defines no get_model_and_input() and uses no NvtxCapture window")
        result["status"] = "ok"
    except ContractError as exc:
        print(f"operator_profiler_harness: the workload does not follow the contract: {exc}", file=sys.stderr)
        result.update(status="error", error={"kind": getattr(exc, "kind", CONTRACT_ERROR), "message": str(exc),
                                             **getattr(exc, "details", {})})
        code = EXIT_CONTRACT
    except BaseException as exc:  # noqa: BLE001 - the workload's own failure is reported, not re-raised
        if (cached := not_cached(exc)) is not None:
            result.update(status="error", error={"kind": NOT_CACHED, "message": str(cached)})
            code = EXIT_NOT_CACHED
        elif (unwritten := cannot_write(exc)) is not None:
            message = f"{unwritten.filename} ({unwritten.strerror})"
            print(f"{CANNOT_WRITE_LINE}{unwritten.filename}: {unwritten.strerror}", file=sys.stderr)
            result.update(status="error", error={"kind": CANNOT_WRITE, "message": message})
            code = EXIT_CANNOT_WRITE
        else:  # the whole traceback in the pass's log (harness.json keeps its tail)
            print(f"operator_profiler_harness: the workload raised during {result['phase']}:", file=sys.stderr)
            traceback.print_exception(type(exc), exc, exc.__traceback__)
            result.update(
                status="error",
                error={"kind": OUT_OF_MEMORY if out_of_memory(exc) else WORKLOAD_RAISED,
                       "message": f"{type(exc).__name__}: {exc}",
                       "traceback_tail": traceback_tail(exc)},
            )
            code = EXIT_WORKLOAD_RAISED
    if pageable is not None:
        pageable.remove()
        result["pageable_batches"], result["pageable_offloads"] = pageable.batches, pageable.offloads
    result["finished_at"] = now()
    write_json(args.result, result)
    if code == EXIT_OK and launched_by_torchrun():
        finish()
    return code


if __name__ == "__main__":
    try:
        exit_code = main()
    except OSError as failed:  # its result could not be written (a full disk): the log says which file
        print(f"{CANNOT_WRITE_LINE}{failed.filename}: {failed.strerror}", file=sys.stderr)
        exit_code = EXIT_CANNOT_WRITE
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (CUDA/Inductor shutdown takes seconds); every result is already on disk.
    os._exit(exit_code)
