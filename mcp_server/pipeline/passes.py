"""The capture passes a backend is made of: torch.profiler, nsys timeline, ncu counters."""

from __future__ import annotations

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
from plugins.ncu.command import NcuOptions, find_ncu, is_replayed_kernel
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
    ncu = find_ncu()
    if ncu is None:
        raise BackendUnavailable("ncu not found", "install Nsight Compute or set NCU=/path/to/ncu")
    pass_dir = req.run_dir / name
    progress(f"{name} pass: replaying the window's kernels for hardware counters")
    early = EarlyStop(when=_replayed_count_reaches(options.max_kernels) if options.max_kernels else None)
    try:
        record, _ = run_pass(req, name, "nvtx", ncu_capture(ncu, pass_dir / "report", options), progress, cancel,
                             early)
    except CaptureFailed as exc:
        _raise_if_permission(pass_dir)
        raise exc
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
    req: CaptureRequest, options: NcuOptions, progress: Progress = _quiet, cancel: Cancel = None
) -> PassRecord | None:
    """Announce the replay plan of RUN_DIR/nsys's timeline; replay its shape variants (RUN_DIR/ncu_variants/)
    when there are any and `options` is the default deduplicated replay of the whole window."""
    plan = plan_replays(req.run_dir / "nsys" / NSYS_SQLITE)
    announce_plan(plan, progress)
    if not (plan.variants and _wants_variants(options)):
        return None
    return ncu_pass(req, _variants_options(options, plan), progress, cancel, name=NCU_VARIANTS)


def _variants_options(options: NcuOptions, plan: ReplayPlan) -> NcuOptions:
    """The ncu options replaying exactly the plan's shape variants (and any launch of their names between)."""
    return replace(options, dedupe=False, kernel_regex=plan.kernel_regex, launch_skip=plan.launch_skip,
                   launch_count=plan.launch_count)


def _wants_variants(options: NcuOptions) -> bool:
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
    log = pass_dir / "output.log"
    if log.is_file() and "ERR_NVGPUCTRPERM" in log.read_text(encoding="utf-8", errors="replace"):
        raise CaptureFailed(
            "ncu may not read GPU performance counters (ERR_NVGPUCTRPERM)",
            "run as root, pass --ncu-sudo (uses `sudo -n`), or allow all users: "
            "`options nvidia NVreg_RestrictProfilingToAdminUsers=0` in /etc/modprobe.d, then reboot",
        )


__all__ = [
    "NCU_VARIANTS", "NcuOptions", "announce_plan", "ncu_pass", "ncu_variants_pass", "nsys_pass", "now_iso",
    "torch_pass",
]
