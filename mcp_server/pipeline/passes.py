"""The capture passes a backend is made of: torch.profiler, nsys timeline, ncu counters."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from mcp_server.errors import BackendUnavailable, CaptureFailed
from mcp_server.pipeline.capture import (
    CaptureRequest,
    EarlyStop,
    Progress,
    _quiet,
    now_iso,
    run_child,
    run_pass,
)
from mcp_server.pipeline.replay_plan import ReplayPlan, plan_replays
from mcp_server.schema.manifest import PassRecord
from plugins.ncu.command import NcuOptions, attach_command, find_ncu, is_replayed_kernel, launch_command
from plugins.ncu.command import capture_command as ncu_capture
from plugins.nsys.command import capture_command as nsys_capture
from plugins.nsys.command import export_command, find_nsys

Cancel = threading.Event | None
NSYS_REPORT = "report.nsys-rep"
NSYS_SQLITE = "report.sqlite"
NCU_REPORT = "report.ncu-rep"
NCU_VARIANTS = "ncu_variants"  # pass and directory of the shape-variant replays


def torch_pass(req: CaptureRequest, progress: Progress = _quiet, cancel: Cancel = None) -> tuple[PassRecord, dict]:
    """Run the window under torch.profiler (Kineto): RUN_DIR/torch/kineto_trace.json."""
    progress("torch.profiler pass: running the workload")
    return run_pass(req, "torch", "torch", progress=progress, cancel=cancel)


def nsys_pass(
    req: CaptureRequest, progress: Progress = _quiet, extra_trace: tuple[str, ...] = (), cancel: Cancel = None
) -> PassRecord:
    """Run the window under nsys and export SQLite: RUN_DIR/nsys/report.sqlite."""
    nsys = find_nsys()
    if nsys is None:
        raise BackendUnavailable("nsys not found", "install Nsight Systems or set NSYS=/path/to/nsys")
    pass_dir = req.run_dir / "nsys"
    progress("nsys pass: recording the measured window's timeline")
    record, _ = run_pass(req, "nsys", "nvtx", nsys_capture(nsys, pass_dir / "report", extra_trace), progress, cancel)
    report = pass_dir / NSYS_REPORT
    if not report.is_file():
        leftovers = sorted(p.name for p in pass_dir.glob("report*"))
        raise CaptureFailed(
            f"nsys wrote no {NSYS_REPORT} (found: {leftovers or 'nothing'})",
            "a .qdstrm alone means nsys's report importer could not run: its libraries (e.g. libdw.so.1) are "
            "missing; run `operator-profiler preflight`",
        )
    progress("nsys pass: exporting SQLite")
    t0 = time.monotonic()
    export = export_command(nsys, report, pass_dir / NSYS_SQLITE)
    code, _ = run_child(export, pass_dir / "export.log", req.timeout_s, cancel=cancel)
    if code != 0 or not (pass_dir / NSYS_SQLITE).is_file():
        raise CaptureFailed(f"nsys export failed (exit {code})", f"read {pass_dir / 'export.log'}")
    record.artifacts += [f"nsys/{NSYS_REPORT}", f"nsys/{NSYS_SQLITE}"]
    record.notes.append(f"sqlite export took {time.monotonic() - t0:.1f} s")
    return record


def ncu_pass(
    req: CaptureRequest, options: NcuOptions, progress: Progress = _quiet, cancel: Cancel = None, name: str = "ncu"
) -> PassRecord:
    """Replay the window's kernels under ncu: RUN_DIR/<name>/report.ncu-rep."""
    ncu = _require_ncu()
    pass_dir = req.run_dir / name
    progress(f"{name} pass: replaying the window's kernels for hardware counters")
    early = EarlyStop(when=_replayed_count_reaches(options.max_kernels) if options.max_kernels else None)
    try:
        record, _ = run_pass(req, name, "nvtx", ncu_capture(ncu, pass_dir / "report", options), progress, cancel,
                             early)
    except CaptureFailed as exc:
        _raise_if_permission(pass_dir)
        raise exc
    return _kept_report(record, req, options, progress)


def _require_ncu() -> str:
    ncu = find_ncu()
    if ncu is None:
        raise BackendUnavailable("ncu not found", "install Nsight Compute or set NCU=/path/to/ncu")
    return ncu


def _kept_report(record: PassRecord, req: CaptureRequest, options: NcuOptions, progress: Progress) -> PassRecord:
    """Check an ncu pass left a report, say why it stopped early if it did, and list the report."""
    name, pass_dir = record.name, req.run_dir / record.directory
    _raise_if_permission(pass_dir)
    if not (pass_dir / NCU_REPORT).is_file():
        if record.stopped_early == "timeout":
            raise CaptureFailed(
                f"the {name} pass ran past its {req.timeout_s:.0f} s limit before ncu replayed any kernel",
                "raise --timeout, or replay fewer kernels (--kernel-regex, --max-kernels)",
            )
        raise CaptureFailed("ncu wrote no report", f"read {pass_dir / 'output.log'}")
    if record.stopped_early == "timeout":
        record.notes.append(f"stopped at the {req.timeout_s:.0f} s limit; the kernels replayed until then are kept")
        progress(f"{name} pass: stopped at the {req.timeout_s:.0f} s limit; keeping the kernels replayed so far")
    elif record.stopped_early == "condition":
        record.notes.append(f"stopped after {options.max_kernels} replayed kernels (--max-kernels)")
        progress(f"{name} pass: {options.max_kernels} kernels replayed (--max-kernels): stopped")
    record.artifacts.append(f"{name}/{NCU_REPORT}")
    return record


def _replayed_count_reaches(limit: int) -> Callable[[str], bool]:
    """A predicate on ncu's output lines that holds once `limit` kernels were replayed."""
    seen = 0

    def reached(line: str) -> bool:
        nonlocal seen
        seen += is_replayed_kernel(line)
        return seen >= limit

    return reached


def ncu_variants_pass(
    req: CaptureRequest,
    options: NcuOptions,
    progress: Progress = _quiet,
    cancel: Cancel = None,
    waiting: WaitingVariantPass | None = None,
) -> PassRecord | None:
    """Announce the replay plan of RUN_DIR/nsys's timeline; replay its shape variants (RUN_DIR/ncu_variants/)
    when there are any and `options` is the default deduplicated replay of the whole window. A `waiting` pass
    (started early, suspended) is attached to, or stopped when there is nothing to replay."""
    plan = plan_replays(req.run_dir / "nsys" / NSYS_SQLITE)
    announce_plan(plan, progress)
    if not (plan.variants and wants_variants(options)):
        if waiting is not None:
            waiting.discard()
        return None
    variant_options = _variants_options(options, plan)
    if waiting is not None:
        record = waiting.attach(variant_options, cancel)
        if record is not None:
            return record
    return ncu_pass(req, variant_options, progress, cancel, name=NCU_VARIANTS)


class _Either(threading.Event):
    """Set when this event or `other` is."""

    def __init__(self, other: Cancel) -> None:
        super().__init__()
        self._other = other

    def is_set(self) -> bool:
        return super().is_set() or (self._other is not None and self._other.is_set())


class WaitingVariantPass:
    """The shape-variant pass of `run`, started with the other passes under `ncu --mode launch`.

    Its workload imports torch and the compiler at once, then waits at its first CUDA call. Once nsys's timeline
    is exported and its plan names shape variants, `attach` connects ncu with the plan's filter: the pass then
    builds, warms up after the ncu pass's window and replays them. `discard` stops it when there is nothing to
    replay. Started this early, its seconds of Python start-up are no longer spent after the ncu pass's replay.
    """

    def __init__(self, req: CaptureRequest, options: NcuOptions, progress: Progress, cancel: Cancel) -> None:
        self.req, self.options, self.progress = req, options, progress
        self.ncu = _require_ncu()
        self.port = _free_port()
        self._stop = _Either(cancel)
        self._waiting = threading.Event()  # ncu's launcher said it waits for a connection
        self._record: PassRecord | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"pass-{NCU_VARIANTS}", daemon=True)

    def start(self) -> WaitingVariantPass:
        """Start the workload; it runs until its first CUDA call, then waits for `attach`."""
        self._thread.start()
        return self

    def _run(self) -> None:
        waiting = replace(self.req, timeout_s=2 * self.req.timeout_s)  # its limit also covers the wait for nsys
        prefix = launch_command(self.ncu, self.port, self.options)

        def watch(line: str) -> None:
            if line.startswith(WAITING_LINE):
                self._waiting.set()
            self.progress(line)

        try:
            self._record, _ = run_pass(waiting, NCU_VARIANTS, "nvtx", prefix, watch, self._stop)
        except BaseException as exc:  # noqa: BLE001 - reported by attach(), or dropped by discard()
            self._error = exc

    def attach(self, options: NcuOptions, cancel: Cancel) -> PassRecord | None:
        """Attach ncu with `options` and let the pass run to its end; None when ncu could not attach (the
        workload is then stopped, and the caller replays in a fresh process)."""
        pass_dir = self.req.run_dir / NCU_VARIANTS
        cmd = attach_command(self.ncu, self.port, pass_dir / "report", options)
        deadline = time.monotonic() + self.req.timeout_s
        while not self._waiting.wait(timeout=0.1) and self._thread.is_alive() and time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                break
        early = EarlyStop()
        if self._waiting.is_set():
            self.progress(f"{NCU_VARIANTS} pass: attaching ncu to the waiting workload to replay the shape variants")
            code, _ = run_child(cmd, pass_dir / "attach.log", self.req.timeout_s, self.progress, cancel, early)
            if code == 0 or (pass_dir / NCU_REPORT).is_file():
                self._thread.join(timeout=ATTACHED_EXIT_S)  # an attached workload ends with ncu's session
        if not self._waiting.is_set() or self._thread.is_alive() or self._record is None and self._error is None:
            self.discard()
            self.progress(f"{NCU_VARIANTS} pass: ncu could not attach (see {pass_dir / 'attach.log'}); "
                          "replaying in a fresh process")
            return None
        if self._error is not None:
            _raise_if_permission(pass_dir)
            raise self._error
        assert self._record is not None
        self._record.attach_command = cmd
        if early.reason is not None:  # no condition was given: only the time limit stops it
            self._record.stopped_early = "timeout"
        return _kept_report(self._record, self.req, options, self.progress)

    def discard(self) -> None:
        """Stop the waiting workload (and its ncu); nothing it did is kept."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


ATTACHED_EXIT_S = 60.0  # how long an attached workload may take to exit once ncu's session has ended
WAITING_LINE = "==PROF== Waiting for profiler to attach"  # what ncu --mode launch prints once it listens


def _free_port() -> int:
    """A TCP port free on this host now, for one launched workload and the ncu that attaches to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _variants_options(options: NcuOptions, plan: ReplayPlan) -> NcuOptions:
    """The ncu options replaying exactly the plan's shape variants (and any launch of their names between)."""
    return replace(options, dedupe=False, kernel_regex=plan.kernel_regex, launch_skip=plan.launch_skip,
                   launch_count=plan.launch_count)


def wants_variants(options: NcuOptions) -> bool:
    """Shape variants get their own pass only behind the default deduplicated replay of the whole window."""
    return options.dedupe and not (
        options.kernel_regex or options.launch_skip or options.launch_count or options.max_kernels
    )


def announce_plan(plan: ReplayPlan, progress: Progress) -> None:
    """Say what the ncu passes replay, with estimated times (estimates: the H200's time per replay pass)."""
    progress(f"ncu: {plan.launches} window launches, {plan.configurations} distinct configurations replayed "
             f"(estimate: {plan.estimate_s(plan.configurations):.0f} s of replay)")
    if plan.variants:
        progress(f"ncu: {len(plan.variants)} launches share a configuration but not the input shapes of an earlier "
                 f"one: a second ncu pass replays them ({plan.launch_count} launches; estimate: "
                 f"{plan.estimate_s(plan.launch_count):.0f} s of replay after it warms up)")


def _raise_if_permission(pass_dir: Path) -> None:
    for log in (pass_dir / "output.log", pass_dir / "attach.log"):
        if log.is_file() and "ERR_NVGPUCTRPERM" in log.read_text(encoding="utf-8", errors="replace"):
            raise CaptureFailed(
                "ncu may not read GPU performance counters (ERR_NVGPUCTRPERM)",
                "run as root, pass --ncu-sudo (uses `sudo -n`), or allow all users: "
                "`options nvidia NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d, then reboot",
            )


__all__ = [
    "NCU_VARIANTS", "NcuOptions", "WaitingVariantPass", "announce_plan", "ncu_pass", "ncu_variants_pass",
    "nsys_pass", "now_iso", "torch_pass", "wants_variants",
]
