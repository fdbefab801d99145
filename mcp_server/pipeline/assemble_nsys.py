"""Assemble the nsys + ncu backend: timeline and NVTX attribution from nsys, counters from ncu."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mcp_server.errors import ProfileFormatError
from mcp_server.pipeline.aggregate import window_totals
from mcp_server.pipeline.assemble import _harness, capture_metadata
from mcp_server.pipeline.attribute import Counters, attribute_stream
from mcp_server.pipeline.join import join_counters, launch_position
from mcp_server.pipeline.passes import NCU_REPORT, NCU_VARIANTS, NSYS_SQLITE
from mcp_server.pipeline.provenance import load_provenance
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from plugins.ncu.command import default_metrics
from plugins.ncu.reader import NcuCapture, NcuReportError, read_ncu_report
from plugins.nsys.reader import NsysExportError, NsysWindow, WindowKernel, read_window

_FILTER_FLAGS = ("--kernel-name", "--launch-skip")


def _read_counters(path: Path) -> tuple[NcuCapture, list[str]]:
    """An ncu report's records with the default metrics, and its warnings."""
    try:
        report = read_ncu_report(path, default_metrics())
    except NcuReportError as exc:
        raise ProfileFormatError(str(exc), "install ncu-report matching the ncu that wrote the report") from exc
    warnings = []
    if report.missing_metrics:
        warnings.append(f"ncu returned no value for {len(report.missing_metrics)} requested metrics: "
                        f"{', '.join(report.missing_metrics)}")
    return report, warnings + report.warnings


def _replay_start(kernels: list[WindowKernel], command: list[str]) -> int:
    """Position of the first launch an ncu command's --kernel-name regex and --launch-skip let it replay."""
    regex = next((a.removeprefix("regex:") for f, a in zip(command, command[1:], strict=False)
                  if f == "--kernel-name" and a.startswith("regex:")), None)
    skip = next((int(a) for f, a in zip(command, command[1:], strict=False) if f == "--launch-skip"), 0)
    return launch_position(kernels, regex, skip) if regex or skip else 0


def assemble_nsys(run_dir: Path, manifest: RunManifest) -> OperatorAttributedProfile:
    """Profile from the nsys pass (durations at real clocks, NVTX stacks) and the ncu pass (counters).

    Without an ncu pass the window's kernels stream from the export straight into their operator calls, so a
    capture of a million kernels never holds more than its profile.
    """
    harness = _harness(run_dir, "nsys")
    try:
        return read_window(
            run_dir / "nsys" / NSYS_SQLITE, lambda timeline: _assemble(run_dir, manifest, harness, timeline)
        )
    except NsysExportError as exc:
        raise ProfileFormatError(str(exc), "re-run `operator-profiler profile --backend nsys`") from exc


def _stopped_early(record: PassRecord) -> str:
    """The warning for a counter pass that kept what it replayed before it was stopped."""
    why = "its time limit (--timeout)" if record.stopped_early == "timeout" else "--max-kernels"
    return f"the {record.name} pass was stopped at {why}: only the kernels it replayed before then carry counters"


def _assemble(run_dir: Path, manifest: RunManifest, harness: dict, timeline: NsysWindow) -> OperatorAttributedProfile:
    kernels: Iterable[WindowKernel] = timeline.kernels()
    counter_warnings: list[str] = []
    counters: Counters | None = None
    ncu_pass = next((p for p in manifest.passes if p.name == "ncu"), None)
    variants_pass = next((p for p in manifest.passes if p.name == NCU_VARIANTS), None)
    if ncu_pass is not None:
        reports = [run_dir / "ncu" / NCU_REPORT] + ([run_dir / NCU_VARIANTS / NCU_REPORT] if variants_pass else [])
        with ThreadPoolExecutor(max_workers=len(reports)) as pool:
            # Each report is read in a child process: all at once, while this one reads the timeline.
            reading = [pool.submit(_read_counters, path) for path in reports]
            kernels = list(kernels)  # the join looks ahead along the launches
            timeline.check_activity_tables()
            read = [future.result() for future in reading]
        (report, _), variants = read[0], (read[1][0] if variants_pass else None)
        counter_warnings += [warning for _, warnings in read for warning in warnings]
        deduplicated = "per-launch-config" in ncu_pass.command
        filtered = any(flag in ncu_pass.command for flag in _FILTER_FLAGS) or (
            "--launch-count" in ncu_pass.command and not deduplicated
        )
        joined, problems, notes = join_counters(
            kernels, report.records, deduplicated, filtered,
            variants=variants.records if variants else (),
            start=_replay_start(kernels, ncu_pass.command),
            variants_start=_replay_start(kernels, variants_pass.command) if variants_pass else 0,
            truncated=ncu_pass.stopped_early is not None,
        )
        counter_warnings += [_stopped_early(p) for p in (ncu_pass, variants_pass) if p and p.stopped_early]
        counter_warnings += [f"nsys/ncu mismatch: {p}" for p in problems] + notes
        counters = lambda ordinal: joined.get(ordinal, ({}, None))  # noqa: E731
    tool = "nsys+ncu" if ncu_pass is not None else "nsys"
    meta = capture_metadata(manifest, harness, tool)
    start = timeline.window_start_ns
    if not start:  # no measure range (or one at 0): the earliest window kernel
        kernels = list(kernels)
        start = min((k.start_ns for k in kernels), default=0)
    operators, unattributed = attribute_stream(
        kernels, load_provenance(run_dir / "nsys"), start, counters, high_confidence_links=False
    )
    del kernels
    timeline.check_activity_tables()
    warnings = list(harness.get("warnings", [])) + timeline.warnings + counter_warnings
    if unattributed:
        warnings.append(f"{len(unattributed)} kernels could not be attributed (kept in unattributed_kernels)")
    window = window_totals(operators, unattributed, harness.get("window", {}).get("wall_time_ns", 0))
    window.gpu_elapsed_ns = harness.get("window", {}).get("gpu_elapsed_ns")
    if ncu_pass is not None:
        window.kernels_with_counters = sum(1 for op in operators for k in op.kernels if k.metrics) + sum(
            1 for k in unattributed if k.metrics
        )
    return OperatorAttributedProfile(
        capture_metadata=meta, window=window, operators=operators, unattributed_kernels=unattributed,
        warnings=warnings,
    )
