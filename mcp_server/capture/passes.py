"""The capture passes: the harness run once as a child process, under torch.profiler, nsys or ncu, into its
folder of the run directory. The engine never imports the workload or torch: the harness runs under the
workload's own interpreter, in its own process group, stopped with it on timeout, error or interrupt."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from mcp_server.backend import Backend
from mcp_server.capture.request import CaptureRequest, harness_command
from mcp_server.children.contract import (
    BATCHES_ASKED,
    CANNOT_WRITE,
    CANNOT_WRITE_LINE,
    CONTRACT_ERROR,
    EXIT_CANNOT_WRITE,
    NO_CUDA,
    NO_TORCH,
    NOT_CACHED,
    OFFLOAD_ASKED,
    OUT_OF_MEMORY,
    PAGEABLE_LINE,
    PHASE_MARKER,
    SPAWNS_RANKS,
    WARMUP_PHASE,
)
from mcp_server.errors import (
    BackendUnavailable,
    CaptureFailed,
    ProfilerError,
    ScriptSpawnsRanks,
    WorkloadError,
    WorkloadOutOfMemory,
)
from mcp_server.process import EarlyStop, interpreter_env, now_iso, run_child, uses_cache
from mcp_server.process.child import exit_description, log_tail
from mcp_server.progress import Progress, quiet
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessError, HarnessResult, load_harness
from mcp_server.schema.manifest import PassRecord
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import SPLIT_NOTE, TIMING_PASS, PassName
from plugins.executables import gpu_name
from plugins.ncu.command import capture_command as ncu_capture
from plugins.ncu.command import find_ncu, is_replayed_kernel, replay_env
from plugins.nsys.command import capture_command as nsys_capture
from plugins.nsys.command import export_command, find_nsys

Cancel = threading.Event | None
COUNT_EVERY_S = 1.0
CPU_UNPROFILED_WINDOWS = 5  # a CPU-only torch pass times the window this many times without the profiler first


class ReplayCount:
    """How many kernels ncu has replayed, and how many the replay plan expects once it is known; the pace of
    the replay so far gives a measured estimate of the time it has left. It also times the pass's warm-up under ncu,
    which a shape-variant pass of the same workload pays again (`warmup_estimate`)."""

    def __init__(self) -> None:
        self.done = 0
        self.expected: int | None = None
        self.limit: int | None = None  # the replayed kernels the pass stops at, once a plan split the budget
        self.seconds_each: float | None = None  # estimated replay time of one kernel, before any was replayed
        self.warmup_iters: int | None = None  # the pass's warm-up iterations (steps of a script)
        self.warmup_s: float | None = None  # how long they took under ncu (measured)
        self._first_at: float | None = None  # when the first and the latest kernel's replay ended (monotonic)
        self._last_at: float | None = None
        self._warmup_from: float | None = None

    def restart(self) -> None:
        """A new attempt of the pass: nothing replayed yet."""
        self.done, self._first_at, self._last_at = 0, None, None
        self.warmup_s, self._warmup_from = None, None

    def entered(self, phase: str, at: float) -> None:
        """The pass's harness entered `phase` at `at` (time.monotonic()): the warm-up is timed from its own phase
        to the next."""
        if phase.startswith(WARMUP_PHASE):
            self._warmup_from = at
        elif self._warmup_from is not None and self.warmup_s is None:
            self.warmup_s = at - self._warmup_from

    def warmup_estimate(self, iters: int) -> float:
        """Seconds a pass of this workload under ncu takes to warm up `iters` iterations, at the pace this pass
        warmed up at (an estimate: a first iteration that compiles costs more than the rest); 0 before it was
        measured."""
        if self.warmup_s is None or not self.warmup_iters:
            return 0.0
        return self.warmup_s * iters / self.warmup_iters

    def replayed(self, at: float) -> None:
        """One more kernel's replay ended at `at` (time.monotonic())."""
        self.done += 1
        self._first_at = at if self._first_at is None else self._first_at
        self._last_at = at

    def pace(self, minimum: int = 5) -> float | None:
        """Seconds per replayed kernel measured so far (None before `minimum` kernels were replayed)."""
        if self.done < minimum or self._first_at is None or self._last_at is None:
            return None
        return (self._last_at - self._first_at) / (self.done - 1)

    def seconds_left(self, now: float) -> float | None:
        """An estimate of the replay's remaining seconds at `now`: the kernels the plan still expects at the
        pace measured between the first and the latest replayed kernel, less the time since the latest; the
        plan's estimate per kernel until two kernels were replayed; None while neither is known."""
        if self.expected is None:
            return None
        left = max(self.expected - self.done, 0)
        if self.done >= 2 and self._first_at is not None and self._last_at is not None:
            pace = (self._last_at - self._first_at) / (self.done - 1)
            return max(left * pace - (now - self._last_at), 0.0)
        return left * self.seconds_each if self.seconds_each is not None else None


class PassProgress:
    """A pass's progress sink: the harness's phases and ncu's replayed kernels become phase lines of the pass
    (the count at most once a second); every line, raw, still goes on to the faces' sink and the pass's log."""

    def __init__(self, name: PassName, progress: Progress, replays: ReplayCount | None = None) -> None:
        self.name, self.progress, self.replays = name, progress, replays
        self._said_at = 0.0

    def __call__(self, line: str) -> None:
        if line.startswith(PHASE_MARKER):
            phase = line.removeprefix(PHASE_MARKER)
            if self.replays is not None:
                self.replays.entered(phase, time.monotonic())
            self.progress(f"{self.name} pass: {phase}")
            return
        if self.replays is not None and is_replayed_kernel(line):
            now = time.monotonic()
            self.replays.replayed(now)
            if now - self._said_at >= COUNT_EVERY_S or self.replays.done == self.replays.expected:
                self._said_at = now
                self.progress(f"{self.name} pass: {self._count(now)}")
        self.progress(line)

    def _count(self, now: float) -> str:
        replays = self.replays
        assert replays is not None
        if replays.expected is None:
            return f"replayed {replays.done} kernels"
        left = replays.seconds_left(now)
        estimate = f" (estimate: {left:.0f} s left)" if left and replays.done < replays.expected else ""
        return f"replayed {replays.done} of {replays.expected} kernel configurations{estimate}"


class NotCached(Exception):
    """A pass asked to compile early from Inductor's cache met a graph the cache did not hold; it ran none of it
    and can be run again to compile after the previous pass's window."""


def read_harness_result(req: CaptureRequest, name: PassName, code: int) -> HarnessResult:
    """The harness's result of pass `name` (whose process ended with `code`), or a CaptureFailed that says how the
    process ended, with the last lines it printed."""
    path, log = req.run_dir.harness_result(name), req.run_dir.output_log(name)
    result = load_harness(path)
    if result is None and code == EXIT_CANNOT_WRITE:
        said = [ln for ln in log_tail(log, 20).split(" | ") if ln.startswith(CANNOT_WRITE_LINE)]
        what = said[0].removeprefix(CANNOT_WRITE_LINE) if said else f"in {req.run_dir.path}"
        raise CaptureFailed(f"the {name} pass could not write its results: {what}", no_space_remedy(req.run_dir))
    if result is None:
        tail = log_tail(log)
        remedy = f"read {log}" if tail else f"nothing was printed: check that {req.python} is a Python interpreter"
        raise CaptureFailed(
            f"the {name} pass's process {exit_description(code)} before the harness wrote its result"
            + (f" (last lines: {tail})" if tail else ""), remedy,
        )
    return result


def no_space_remedy(run_dir: RunDir) -> str:
    """What to do when the run directory's disk is full."""
    return f"free space on the disk holding {run_dir.path}, or pass --output on another disk"


def raise_for_harness(result: HarnessResult, req: CaptureRequest, name: PassName) -> None:
    """Turn a harness error into a one-line WorkloadError with the remedy and the traceback's tail."""
    if result.ok:
        return
    error = result.error or HarnessError()
    kind, message = error.kind, error.message
    if kind == NO_TORCH:
        raise WorkloadError(message, "pass --python PATH to an interpreter that has torch, or install torch there")
    if kind == CONTRACT_ERROR:
        raise WorkloadError(message, "see README: workload contract")
    if kind == NOT_CACHED:
        raise NotCached(message)
    if kind == NO_CUDA:
        raise BackendUnavailable(message, "run it on a machine with an NVIDIA GPU, under an interpreter whose torch "
                                          "has CUDA (see `operator-profiler preflight`)")
    if kind == OUT_OF_MEMORY:
        raise WorkloadOutOfMemory(f"the workload ran out of GPU memory during {result.phase} in the "
                                  f"{name} pass: {message.splitlines()[0]}",
                                  "see what held the memory: `operator-profiler memory WORKLOAD` (the same options)")
    if kind == SPAWNS_RANKS:
        raise ScriptSpawnsRanks(int(getattr(error, "ranks", 2)), message)
    if kind == CANNOT_WRITE:
        raise CaptureFailed(f"the {name} pass could not write {message}", no_space_remedy(req.run_dir))
    tail = error.traceback_tail.strip().splitlines()
    where = f" (last lines: {' | '.join(line.strip() for line in tail[-3:])})" if tail else ""
    raise WorkloadError(
        f"the workload raised {message} during {result.phase}{where}",
        f"fix the workload; full output in {req.run_dir.output_log(name)}",
    )


def run_pass(
    req: CaptureRequest,
    name: PassName,
    profiler: str,
    prefix: list[str] | None = None,
    progress: Progress = quiet,
    cancel: Cancel = None,
    early: EarlyStop | None = None,
    replays: ReplayCount | None = None,
    replaying: bool = False,
) -> tuple[PassRecord, HarnessResult | None]:
    """Run one harness pass into its folder of the run directory, optionally under a profiler prefix; return
    its record and the harness's result. A pass `replaying` under ncu runs with `plugins.ncu.command.replay_env`.

    With `early`, a pass stopped at its time limit or by `early.when` is not a failure: its record says
    `stopped_early` and the result is empty (the harness never finished); the caller keeps what it gathered.
    """
    run_dir = req.run_dir
    run_dir.pass_dir(name).mkdir(parents=True, exist_ok=True)
    run_dir.harness_result(name).unlink(missing_ok=True)
    cmd = [*(prefix or []), *harness_command(req, profiler, name)]
    env = interpreter_env(req.python)
    if replaying:
        env = replay_env(env)
    started, t0 = now_iso(), time.monotonic()
    sink = PassProgress(name, progress, replays)
    strays: list[str] = []
    code, timed_out = run_child(cmd, run_dir.output_log(name), req.timeout_s, sink, cancel, early, env=env,
                                stopped=strays)
    wall = time.monotonic() - t0
    for stray in strays:
        progress(f"{name} pass: stopped process {stray}, which the workload left running in a session of its own")
    if timed_out and early is None:
        raise CaptureFailed(
            f"the {name} pass ran past its {req.timeout_s:.0f} s limit and was stopped",
            "raise --timeout, or shrink the workload's sizes",
        )
    record = PassRecord(
        name=name, profiler=profiler, command=cmd, directory=name, started_at=started,
        wall_time_s=round(wall, 3), exit_code=code, stopped_processes=strays,
    )
    if req.turn.cpu_threads is not None:
        record.notes.append(f"torch's CPU threads held to {req.turn.cpu_threads} in this pass, its share of the CPUs "
                            "while the run's passes run at once (children/cpu_share.py)")
    if uses_cache(req.python):
        record.notes.append(f"bytecode cached in {env['PYTHONPYCACHEPREFIX']} (the environment forbids writing it)")
    if early is not None and early.reason is not None:
        record.stopped_early = early.reason  # type: ignore[assignment]  # "timeout" or "condition"
        return record, None
    try:
        result = read_harness_result(req, name, code)
        raise_for_harness(result, req, name)
    except ProfilerError as exc:
        record.notes.append(f"failed: {exc.message}")
        exc.records.append(record)
        raise
    record.artifacts = [run_dir.relative(run_dir.harness_result(name))] + [
        f"{name}/{artifact}" for artifact in result.artifacts
    ]
    return record, result


def torch_pass(req: CaptureRequest, progress: Progress = quiet, cancel: Cancel = None) -> PassRecord:
    """Run the window under torch.profiler (Kineto): the torch pass's Kineto trace."""
    progress("torch.profiler pass: running the workload")
    spread = req.with_turn(unprofiled_windows=CPU_UNPROFILED_WINDOWS)  # only where CUDA is missing (the harness)
    return run_pass(spread, "torch", "torch", progress=progress, cancel=cancel)[0]


def timing_pass(req: CaptureRequest, progress: Progress = quiet, cancel: Cancel = None) -> PassRecord:
    """Measure the window with no profiler (no NVTX, no hooks, no operator recording), `req.windows` times, while
    CUPTI alone records the kernels: the ground truth of the window's length and GPU busy time."""
    progress(f"timing pass: measuring the window {req.turn.windows} times without the profiler")
    return run_pass(req, TIMING_PASS, "kernels", progress=progress, cancel=cancel)[0]


def nsys_pass(req: CaptureRequest, progress: Progress = quiet, cancel: Cancel = None) -> PassRecord:
    """Run the window under nsys and export the timeline to SQLite."""
    nsys = find_nsys()
    if nsys is None:
        raise BackendUnavailable("nsys not found", "install Nsight Systems or set NSYS=/path/to/nsys")
    run_dir = req.run_dir
    progress("nsys pass: recording the measured window's timeline")
    record, _ = run_pass(req, "nsys", "nvtx", nsys_capture(nsys, run_dir.nsys_report_base()), progress, cancel)
    return exported_timeline(nsys, run_dir, record, req.timeout_s, progress, cancel)


class CapturingBackend(Backend, Protocol):
    """A backend as capture runs it: the protocol, plus the two functions that run its main pass (its adapter in
    `mcp_server.backends` points them at this package's passes)."""

    def run_main(self, req: CaptureRequest, progress: Progress, cancel: Cancel) -> PassRecord:
        """Run its main pass into `req.run_dir` (in one process)."""
        ...

    def run_ranks(self, req: CaptureRequest, ranks: list[int], progress: Progress,
                  cancel: Cancel) -> dict[int, PassRecord]:
        """Run its main pass on every rank of a torchrun launch."""
        ...


def exported_timeline(
    nsys: str, run_dir: RunDir, record: PassRecord, timeout_s: float, progress: Progress = quiet,
    cancel: Cancel = None, who: str = "",
) -> PassRecord:
    """Export the nsys report of `run_dir` to SQLite and list both in `record`; `who` names a rank in messages."""
    report, sqlite = run_dir.nsys_report(), run_dir.nsys_sqlite()
    if not report.is_file():
        leftovers = sorted(p.name for p in report.parent.glob("report*"))
        raise CaptureFailed(
            f"{who}nsys wrote no {report.name} (found: {leftovers or 'nothing'})",
            "a .qdstrm alone means nsys's report importer could not run: its libraries (e.g. libdw.so.1) are "
            "missing; run `operator-profiler preflight`",
        )
    progress(f"nsys pass: exporting {who}SQLite")
    t0 = time.monotonic()
    code, _ = run_child(export_command(nsys, report, sqlite), run_dir.export_log(), timeout_s, cancel=cancel)
    if code != 0 or not sqlite.is_file():
        raise CaptureFailed(f"{who}nsys export failed (exit {code})", f"read {run_dir.export_log()}")
    record.artifacts += [run_dir.relative(report), run_dir.relative(sqlite)]
    record.notes.append(f"sqlite export took {time.monotonic() - t0:.1f} s")
    return record


def require_ncu() -> str:
    """ncu's path, or BackendUnavailable with the remedy."""
    ncu = find_ncu()
    if ncu is None:
        raise BackendUnavailable("ncu not found", "install Nsight Compute or set NCU=/path/to/ncu")
    return ncu


def ncu_pass(
    req: CaptureRequest, options: NcuOptions, progress: Progress = quiet, cancel: Cancel = None,
    name: PassName = "ncu", replays: ReplayCount | None = None,
) -> PassRecord:
    """Replay the window's kernels under ncu, as `options` say, into pass `name`'s report (DataLoader batches left
    pageable there: `children.pinned`)."""
    ncu = require_ncu()
    req = req.with_turn(pageable_batches=True)
    progress(f"{name} pass: replaying the window's kernels for hardware counters")
    replays = replays or ReplayCount()
    replays.warmup_iters = req.options.warmup_iters
    early = EarlyStop(when=_replayed_count_reaches(options.max_kernels) if options.max_kernels
                      else _over_budget(options.replay_budget_s, replays) if options.whole_window else None)
    prefix = ncu_capture(ncu, req.run_dir.ncu_report_base(name), options, req.compile_mode == "cudagraphs",
                         gpu_name())
    try:
        record, harness = run_pass(req, name, "nvtx", prefix, progress, cancel, early, replays, replaying=True)
    except CaptureFailed:
        raise_if_permission(req, name)
        raise
    record.ncu = options
    split = replays.limit if replays.limit is not None and replays.done >= replays.limit else None
    return kept_report(record, req, progress, harness, split)


def kept_report(record: PassRecord, req: CaptureRequest, progress: Progress,
                harness: HarnessResult | None = None, split: int | None = None) -> PassRecord:
    """Check an ncu pass left a report, say why it stopped early if it did, and list the report; `harness` (its
    harness.json, None when the pass stopped before writing it) says what pinned memory its window held; `split`: the
    count it stopped at, where the replay budget's plan split the configurations with a second pass."""
    name, run_dir = record.name, req.run_dir
    raise_if_permission(req, name)
    report = run_dir.ncu_report(name)
    if not report.is_file():
        if record.stopped_early == "timeout":
            raise CaptureFailed(
                f"the {name} pass ran past its {req.timeout_s:.0f} s limit before ncu replayed any kernel",
                "raise --timeout, or replay fewer kernels (--kernel-regex, --max-kernels)",
            )
        failed = CaptureFailed("ncu wrote no report", f"read {run_dir.output_log(name)}")
        failed.records.append(record)
        raise failed
    max_kernels = record.ncu.max_kernels if record.ncu else None
    budget = record.ncu.replay_budget_s if record.ncu else None
    if record.stopped_early == "timeout":
        record.notes.append(f"stopped at the {req.timeout_s:.0f} s limit; the kernels replayed until then are kept")
        progress(f"{name} pass: stopped at the {req.timeout_s:.0f} s limit; keeping the kernels replayed so far")
    elif record.stopped_early == "condition" and max_kernels:
        record.notes.append(f"stopped after {max_kernels} replayed kernels (--max-kernels)")
        progress(f"{name} pass: {max_kernels} kernels replayed (--max-kernels): stopped")
    elif record.stopped_early == "condition" and split is not None:
        record.notes.append(f"{SPLIT_NOTE} the first {split} configurations in launch order, the rest to the second "
                            "pass by the kernel time they hold")
        progress(f"{name} pass: the first {split} configurations replayed: stopped (the replay budget's split)")
    elif record.stopped_early == "condition":
        record.notes.append(f"stopped at the replay budget ({budget:.0f} s, --replay-budget): the configurations "
                            "replayed until then are kept")
        progress(f"{name} pass: replay budget reached: stopped")
    log = run_dir.output_log(name)
    if log.is_file() and (note := pageable_note(log.read_text(encoding="utf-8", errors="replace"))) is not None:
        record.notes.append(note)
    if (note := _pinned_note(harness)) is not None:
        record.notes.append(note)
        progress(f"{name} pass: {note}")
    record.artifacts.append(run_dir.relative(report))
    return record


PINNED_NOTE_BYTES = 64 * 2**20  # pinned memory at an ncu window worth a note: about 0.09 s more per replayed kernel


def _pinned_note(harness: HarnessResult | None) -> str | None:
    """What the pinned host memory the workload still held at the ncu pass's window cost its replay, when it is worth
    saying (`PINNED_NOTE_BYTES`); None otherwise, or without the pass's harness.json (stopped at its budget)."""
    held = harness.the_window.pinned_host_bytes if harness is not None else None
    if held is None or held < PINNED_NOTE_BYTES:
        return None
    mib = held / 2**20
    return (f"the workload held {mib:.0f} MiB of pinned host memory as the window began: ncu restores it before "
            f"every replay pass of every kernel (about {mib * 1.4e-3:.2f} s more per kernel on an H200); pin less, "
            "or release what the host allocator caches (torch.accelerator.empty_host_cache() where this torch has "
            "it) before the window, to replay faster")


def pageable_note(log: str) -> str | None:
    """What the workload asked to pin and the pass left pageable, from its output (`PAGEABLE_LINE`); None if
    nothing."""
    left = [what for asked, what in ((BATCHES_ASKED, "DataLoader batches"),
                                     (OFFLOAD_ASKED, "activations offloaded by save_on_cpu"))
            if PAGEABLE_LINE + asked in log]
    if not left:
        return None
    return (f"the workload's {' and '.join(left)} were left pageable in this pass (ncu restores pinned host memory "
            "before each replay pass of every kernel: about 1.4 ms per MiB on an H200); the timeline's pass kept "
            "them pinned")


PERMISSION_ERROR = "ERR_NVGPUCTRPERM"  # what ncu prints when it may not read the counters


def _replayed_count_reaches(limit: int) -> Callable[[str], bool]:
    """A predicate on ncu's output lines that holds once `limit` kernels were replayed."""
    seen = 0

    def reached(line: str) -> bool:
        nonlocal seen
        seen += is_replayed_kernel(line)
        return seen >= limit

    return reached


def _over_budget(budget_s: float, replays: ReplayCount | None = None) -> Callable[[str], bool]:
    """A predicate on ncu's output lines that holds once the replay budget is spent: the replay's own time (measured
    from the first replayed kernel, one kernel's worth added for the first) past `budget_s`. Not the plan's count of
    affordable kernels: that count comes from the pace of the first kernels replayed, and a training step's first
    convolutions, over the largest activations, replay slower than the rest (0.37 s against 0.31 s on average for a
    ResNet-50 training script on an H200: the count would have left 2 of its 164 configurations without counters).
    It also holds once `replays.limit` kernels were replayed: a plan that split the budget set it."""
    seen, first = 0, None

    def reached(line: str) -> bool:
        nonlocal seen, first
        if not is_replayed_kernel(line):
            return False
        seen += 1
        if replays is not None and replays.limit is not None and seen >= replays.limit:
            return True
        now = time.monotonic()
        first = now if first is None else first
        spent = (now - first) * seen / (seen - 1) if seen > 1 else 0.0
        return spent > budget_s

    return reached


def raise_if_permission(req: CaptureRequest, name: PassName) -> None:
    """CaptureFailed with the remedy when ncu said it may not read the GPU's performance counters."""
    for log in (req.run_dir.output_log(name), req.run_dir.attach_log(name)):
        if log.is_file() and PERMISSION_ERROR in log.read_text(encoding="utf-8", errors="replace"):
            raise CaptureFailed(
                f"ncu may not read GPU performance counters ({PERMISSION_ERROR})",
                "run as root, pass --ncu-sudo (uses `sudo -n`), or allow all users: "
                "`options nvidia NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d, then reboot",
            )


def kept_failure(exc: ProfilerError, name: PassName, what: str, consequence: str,
                 progress: Progress) -> list[PassRecord]:
    """A pass that failed, as a run that goes on without it keeps it: `the <what> failed (<why>): <consequence>` is
    said and added to the notes of the records the failure carries; those records."""
    line = f"the {what} failed ({exc.one_line()}): {consequence}"
    progress(f"{name} pass: {line}")
    records = [r for r in exc.records if isinstance(r, PassRecord)]
    for record in records:
        record.notes.append(line)
    return records
