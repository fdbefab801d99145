"""The capture stage: choose a backend, run its passes into a run directory, write the manifest.

nsys backend: the no-profiler timing pass, the nsys timeline pass and (with ncu options) the ncu counter pass start
together, so their start-ups overlap; a lock file then gives the GPU to one window at a time. `map` adds the ncu
pass later.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mcp_server.capture.passes import (
    PERMISSION_ERROR,
    Cancel,
    CapturingBackend,
    NotCached,
    ReplayCount,
    kept_failure,
    ncu_pass,
    timing_pass,
)
from mcp_server.capture.plan import BYTECODE, Marker, plan_passes
from mcp_server.capture.request import CaptureRequest, WorkloadOptions
from mcp_server.capture.variants import WaitingVariantPass, ncu_variants_pass, planned
from mcp_server.children.contract import BACKWARD_STEPS
from mcp_server.errors import CancelledCapture, CaptureFailed, ProfilerError
from mcp_server.process import now_iso
from mcp_server.process.bytecode import Precompile, precompile_notes, precompiling, usable_cpus
from mcp_server.progress import Progress, quiet
from mcp_server.progress import tagged as _tagged
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import COUNTER_PASS, TIMING_PASS, VARIANT_PASS, CaptureBackend, PassName, RunMode
from plugins.executables import query_gpu, tool_version


def run_mode(options: WorkloadOptions) -> RunMode:
    """What one window step runs: a training step (the workload's train_step, or a script's optimizer steps or
    backward() calls) or an inference."""
    training = options.window_fn is None or options.window_fn == BACKWARD_STEPS
    return "train_step" if options.train_step or (options.script and training) else "inference"


def new_manifest(req: CaptureRequest, label: CaptureBackend, command_line: list[str],
                 tools: dict[str, str | None] | None = None) -> RunManifest:
    """A manifest describing the request, before any pass ran: `label` says what captures it, and the versions of
    `tools` (by name, their paths) and the GPU are asked for at once (each query starts a process)."""
    found = {name: path for name, path in (tools or {}).items() if path}
    with ThreadPoolExecutor(max_workers=1 + len(found)) as pool:
        gpu = pool.submit(query_gpu)
        asked = {name: pool.submit(tool_version, path) for name, path in found.items()}
        versions = {name: version for name, future in asked.items() if (version := future.result())}
        return RunManifest(
            created_at=now_iso(), workload=str(req.workload.resolve()), python=req.python, backend=label,
            compile_mode=req.compile_mode, run_mode=run_mode(req.options), warmup_iters=req.options.warmup_iters,
            iters=req.options.iters, seed=req.options.seed, command_line=command_line, tool_versions=versions,
            gpu=gpu.result(),
        )


def capture(
    req: CaptureRequest,
    backend: CapturingBackend,
    command_line: list[str],
    progress: Progress = quiet,
    ncu: NcuOptions | None = None,
    cancel: Cancel = None,
    timing: bool = False,
) -> RunManifest:
    """Run the backend's capture passes into the run directory and write manifest.json.

    The backend's main pass (torch.profiler, or nsys's timeline), with `timing` the no-profiler timing pass, and on
    a backend with counters (unless `ncu` is None) the ncu counter pass, all started together. Setting `cancel`
    stops every child early (CancelledCapture).
    """
    req.check()
    run_dir = req.run_dir.prepare()
    run_dir.bytecode_done.unlink(missing_ok=True)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool, \
                precompiling(req.python, req.workload, run_dir.bytecode_log, req.compile_mode != "eager",
                             _tagged("bytecode", progress), done=run_dir.bytecode_done) as precompile:
            # The manifest's facts are gathered while the passes start; it is written before any pass ends.
            described = pool.submit(_described, req, backend, command_line)
            compiled = run_dir.bytecode_done if precompile is not None else None
            try:
                records = _in_turn(req, backend, ncu if backend.counters else None, timing, progress, cancel,
                                   compiled)
            except ProfilerError as exc:  # the manifest says which passes ran and how they ended
                with contextlib.suppress(OSError):  # a full disk: the pass's own error says so
                    _record(req, described.result(), [r for r in exc.records if isinstance(r, PassRecord)],
                            precompile)
                raise
    finally:
        run_dir.bytecode_done.unlink(missing_ok=True)
    return _record(req, described.result(), records, precompile)


def _record(req: CaptureRequest, manifest: RunManifest, records: list[PassRecord],
            precompile: Precompile | None = None) -> RunManifest:
    manifest.passes += records
    manifest.notes += precompile_notes(precompile, req.run_dir.path)
    req.run_dir.write_manifest(manifest)
    return manifest


def _described(req: CaptureRequest, backend: CapturingBackend, command_line: list[str]) -> RunManifest:
    manifest = new_manifest(req, backend.label, command_line, backend.tools())
    req.run_dir.write_manifest(manifest)
    return manifest


def _in_turn(
    req: CaptureRequest, backend: CapturingBackend, ncu: NcuOptions | None, timing: bool, progress: Progress,
    outer: Cancel, compiled: Path | None = None,
) -> list[PassRecord]:
    """Run a backend's passes at once, as `plan_passes` plans them: their imports overlap, then they take the GPU in
    turn.

    The no-profiler timing pass (`timing`) measures first, its window repeated, while the other passes wait for the
    GPU and load no CPU: its host-sensitive windows never run beside the main pass's profiler stopping or its
    timeline's export. The main pass (torch.profiler, or nsys's timeline) measures next; then ncu's replay. The
    first pass to compile (the timing pass, else the main pass) fills Inductor's cache with the Triton
    configurations it autotuned, and the passes after it find them there. In eager mode, and under Inductor when
    the cache already holds every graph (from an earlier run), the passes after the first warm up alongside it:
    nothing autotunes then (unless the workload turns cuDNN's autotuner on: its passes then wait), and only the
    windows take turns; a graph the cache lacks stops that attempt before it runs, and the pass starts again: the
    ncu pass compiles from the cache beside the main pass once the timing pass's window is done (the cache then
    holds its graphs), the main pass after that window. A fourth pass, for shape variants, starts with them
    (while the bytecode is precompiled, once that or the main pass's window has ended) suspended under
    `ncu --mode launch`; once the timeline is exported, its replay plan is announced and, when
    launches of one ncu configuration differ in input shapes, ncu attaches to it, a few seconds before ncu's replay
    is estimated to end, to replay those variants after it; otherwise it is stopped. The timing pass is best
    effort: when it fails, the run goes on and the manifest says why. With `compiled` (the bytecode precompile's
    end), the timing pass warms up and measures once that file exists: no compile workers run beside its window.
    """
    run_dir = req.run_dir
    plan = {p.name: p for p in plan_passes(
        backend, counters=ncu is not None, timing=timing,
        whole_window=ncu is not None and ncu.whole_window, compile_mode=req.compile_mode,
        warmup_iters=req.options.warmup_iters, precompiling=compiled is not None, script=req.options.script)}

    def marker(name: Marker | None) -> Path | None:
        if name is None:
            return None
        return compiled if name == BYTECODE else run_dir.window_done(name)

    markers = [run_dir.gpu_lock, *(run_dir.window_done(p.done) for p in plan.values() if p.done is not None)]
    for path in markers:
        path.unlink(missing_ok=True)
    tagged = _tagged if len(plan) > 1 else _untagged
    threads = cpu_share(len(plan))

    def request(name: PassName) -> CaptureRequest:
        planned = plan[name]
        if not planned.locked:
            return req.with_turn(record_graph_capture=planned.record_graph_capture)
        changed = req.with_turn(lock=run_dir.gpu_lock, after=marker(planned.after), done=marker(planned.done),
                                warm_up_early=planned.warm_up_early, windows=planned.windows,
                                import_compiler_early=planned.import_compiler_early,
                                record_graph_capture=planned.record_graph_capture, cpu_threads=threads)
        return changed.with_options(warmup_iters=planned.warmup_iters) if planned.warmup_iters is not None \
            else changed

    main_name = backend.main_pass
    cancel = threading.Event()
    replays = ReplayCount()
    variants = plan.get(VARIANT_PASS)
    waiting = (WaitingVariantPass(request(VARIANT_PASS), ncu, tagged(VARIANT_PASS, progress), cancel,
                                  after=tuple(p for m in variants.started_after if (p := marker(m)) is not None))
               if variants is not None and ncu is not None else None)

    def in_turn(name: PassName, run: Callable[[CaptureRequest], PassRecord]) -> PassRecord:
        return _compiled_in_turn(run, request(name), name, progress, filled=marker(plan[name].retry_after))

    def main_then_variants() -> list[PassRecord]:
        records = [in_turn(main_name, lambda r: backend.run_main(r, tagged(main_name, progress), cancel))]
        if ncu is None:
            return records
        found = ncu_variants_pass(request(VARIANT_PASS), ncu, tagged(VARIANT_PASS, progress), cancel, waiting, replays)
        return records + ([found] if found else [])

    def no_profiler() -> list[PassRecord]:
        try:
            return [in_turn(TIMING_PASS, lambda r: timing_pass(r, tagged(TIMING_PASS, progress), cancel))]
        except CancelledCapture:
            raise
        except ProfilerError as exc:
            progress(f"[timing] timing pass: failed, the analysis keeps to the profiled window: {exc.message}")
            for record in exc.records:
                if isinstance(record, PassRecord):
                    record.notes.append("the timing pass failed; the run went on without it")
            return [r for r in exc.records if isinstance(r, PassRecord)]
        finally:
            run_dir.window_done(TIMING_PASS).touch()  # also when the pass stopped before its harness marked it done

    def counters() -> list[PassRecord]:
        assert ncu is not None
        try:
            def replay(r: CaptureRequest) -> PassRecord:
                replays.restart()
                return ncu_pass(r, ncu, tagged(COUNTER_PASS, progress), cancel=cancel, replays=replays)

            return [in_turn(COUNTER_PASS, replay)]
        except CaptureFailed as exc:  # ncu died on a kernel it could not replay: the other passes' results stand
            if PERMISSION_ERROR in exc.message:
                raise
            return counters_failed(exc, tagged(COUNTER_PASS, progress))
        finally:
            run_dir.window_done(COUNTER_PASS).touch()  # also when ncu stopped before its harness marked the window done

    runners: dict[str, Callable[[], list[PassRecord]]] = {"main": main_then_variants, "timing": no_profiler,
                                                          "ncu": counters}
    jobs: dict[str, Callable[[], list[PassRecord]]] = {p.runner: runners[p.runner] for p in plan.values()}
    results = _run_threads(jobs, cancel, outer, waiting, markers)
    main, *after_main = results["main"]
    assert main.name == main_name
    return [main, *results.get("timing", []), *results.get("ncu", []), *after_main]


def counters_failed(exc: CaptureFailed, progress: Progress) -> list[PassRecord]:
    """An ncu pass that failed, as the run keeps it: its record says why, and the profile is assembled without the
    counters it did not write (ncu stops the whole process when it cannot replay one kernel: a DataParallel's gather,
    reading another GPU's memory, for one); nsys' timeline, the attribution and the timing pass stand."""
    return kept_failure(exc, COUNTER_PASS, "ncu pass", "the profile carries no ncu counters of it", progress)


def cpu_share(passes: int) -> int | None:
    """torch's intra-op threads for each of `passes` processes running at once: an equal share of the CPUs this
    process may use (`children.cpu_share`); None for a lone pass."""
    if passes < 2:
        return None
    return max(1, usable_cpus() // passes)


def _run_threads(jobs: dict[str, Callable[[], list[PassRecord]]], cancel: threading.Event, outer: Cancel,
                 waiting: WaitingVariantPass | None, markers: list[Path]) -> dict[str, list[PassRecord]]:
    """Run each job in its own thread; on a failure or `outer`'s cancel, stop them all. The records by job, or the
    first real failure re-raised (carrying the records of the jobs that finished) once every thread has ended."""
    results: dict[str, list[PassRecord]] = {}
    errors: dict[str, BaseException] = {}

    def work(name: str) -> None:
        try:
            results[name] = jobs[name]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after every pass stopped
            errors[name] = exc
            cancel.set()

    threads = [threading.Thread(target=work, args=(name,), name=f"pass-{name}") for name in jobs]
    if waiting is not None:
        waiting.start()
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            if outer is not None and outer.is_set():
                cancel.set()
            for thread in threads:
                thread.join(timeout=0.2)
    except BaseException:  # Ctrl-C or a signal in this thread: stop every pass, then go on unwinding
        cancel.set()
        for thread in threads:
            thread.join()
        raise
    finally:
        if waiting is not None:
            waiting.discard()  # stopped already unless a pass failed before the plan
        if not any(t.is_alive() for t in threads):
            for path in markers:
                path.unlink(missing_ok=True)
    real = [e for e in errors.values() if not isinstance(e, CancelledCapture)]
    if real or errors:
        failure = (real or list(errors.values()))[0]
        if isinstance(failure, ProfilerError):
            failure.records += [r for done in results.values() for r in done]
        raise failure
    return results


def _untagged(_name: str, progress: Progress) -> Progress:
    return progress


def _compiled_in_turn(
    run: Callable[[CaptureRequest], PassRecord], req: CaptureRequest, name: str, progress: Progress,
    filled: Path | None = None,
) -> PassRecord:
    """Run a pass that compiles early from Inductor's cache when it may. On a graph the cache lacks, again: from
    the cache, still beside the other passes, once `filled` exists (the first compiling pass's window is done, so
    the cache holds its graphs); failing that, compiling after the previous pass's window."""
    try:
        return run(req)
    except NotCached:
        pass
    if req.turn.warm_up_early and filled is not None:
        progress(f"[{name}] Inductor's cache lacks this workload's graphs: compiling from it once the first "
                 "compiling pass has filled it")
        try:
            record = run(req.with_turn(warm_up_after=filled))
        except NotCached:
            pass
        else:
            record.notes.append("compiled from Inductor's cache once the first compiling pass's window was done: "
                                "the cache did not hold every graph before")
            return record
    progress(f"[{name}] Inductor's cache lacks this workload's graphs: compiling after the previous window")
    record = run(req.with_turn(warm_up_early=False, warm_up_after=None))
    record.notes.append("compiled after the previous pass's window: Inductor's cache did not hold every graph")
    return record


def map_counters(
    req: CaptureRequest, options: NcuOptions, progress: Progress = quiet, cancel: Cancel = None
) -> RunManifest:
    """Add the ncu pass to an existing run directory (the `map` stage), replacing any earlier one; the bytecode
    it imports is compiled beside it where none is cached (another machine's run)."""
    replays = ReplayCount()
    plan = planned(req, options, progress, replays) if req.run_dir.nsys_sqlite().is_file() else None
    with req.run_dir.updating_manifest() as manifest:
        with precompiling(req.python, req.workload, req.run_dir.map_bytecode_log, req.compile_mode != "eager",
                          _tagged("bytecode", progress)) as precompile:
            manifest.passes = [p for p in manifest.passes if p.name not in (COUNTER_PASS, VARIANT_PASS)]
            manifest.passes.append(ncu_pass(req, options, progress, cancel, replays=replays))
            if plan is not None:
                variants = ncu_variants_pass(req, options, progress, cancel, plan=plan, replays=replays)
                if variants:
                    manifest.passes.append(variants)
        manifest.notes += precompile_notes(precompile, req.run_dir.path, "map's ncu pass")
    return manifest
