"""Assemble the nsys + ncu backend: timeline and NVTX attribution from nsys, counters from ncu."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mcp_server.assemble.aggregate import counter_coverage, host_compute, module_coverage_warning, window_totals
from mcp_server.assemble.attribute import Context, Counters, attribute_stream
from mcp_server.assemble.events import (
    OperatorKeys,
    attribute_events,
    ddp_timed,
    event_warnings,
    sites_from_graph_breaks,
)
from mcp_server.assemble.join import join_counters, launch_position
from mcp_server.assemble.metadata import capture_metadata, harness_result, may_run_backward
from mcp_server.assemble.phases import settle_phases
from mcp_server.assemble.provenance import load_provenance
from mcp_server.assemble.threads import OtherThreads
from mcp_server.errors import ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import COUNTER_PASS, SPLIT_NOTE, VARIANT_PASS
from plugins.ncu.command import default_metrics, is_collective
from plugins.ncu.reader import NcuCapture, NcuReportError, read_ncu_report
from plugins.nsys.reader import NsysExportError, NsysWindow, WindowKernel, read_window


def _read_counters(path: Path) -> tuple[NcuCapture, list[str]]:
    """An ncu report's records with the default metrics, and its warnings (missing metrics among them)."""
    try:
        report = read_ncu_report(path, default_metrics())
    except NcuReportError as exc:
        raise ProfileFormatError(str(exc), "install ncu-report matching the ncu that wrote the report") from exc
    return report, report.warnings


def _replay_start(kernels: list[WindowKernel], options: NcuOptions) -> int:
    """Position of the first launch a pass's kernel regex and launch skip let ncu replay."""
    if not (options.kernel_regex or options.launch_skip):
        return 0
    return launch_position(kernels, options.kernel_regex, options.launch_skip or 0)


def assemble_nsys(run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
    """Profile from the nsys pass (durations at real clocks, NVTX stacks) and the ncu pass (counters).

    Without an ncu pass the window's kernels stream from the export straight into their operator calls, so a
    capture of a million kernels never holds more than its profile.
    """
    harness = harness_result(run_dir, "nsys")
    try:
        return read_window(run_dir.nsys_sqlite(), lambda timeline: _assemble(run_dir, manifest, harness, timeline))
    except NsysExportError as exc:
        raise ProfileFormatError(str(exc), "re-run `operator-profiler profile --backend nsys`") from exc


def _stopped_early(record: PassRecord, second_pass: bool = True) -> str:
    """The warning for a counter pass that kept what it replayed before it was stopped (`second_pass`: whether the
    split's second pass left a report)."""
    if any(note.startswith(SPLIT_NOTE) for note in record.notes):
        if not second_pass:
            return (f"the {record.name} pass was stopped at the replay budget's split (--replay-budget), and its "
                    "second pass left no counters (it did not run, or failed: the progress says which): the "
                    "configurations after the split carry none (raise --replay-budget)")
        return (f"the {record.name} pass was stopped at the replay budget's split (--replay-budget): the "
                "configurations it replayed and those of the second pass carry counters")
    budget = any("--replay-budget" in note for note in record.notes)  # the pass's own account of its stop
    why = ("its time limit (--timeout)" if record.stopped_early == "timeout"
           else "the replay budget (--replay-budget)" if budget else "--max-kernels")
    return f"the {record.name} pass was stopped at {why}: only the kernels it replayed before then carry counters"


def _options(record: PassRecord) -> NcuOptions:
    if record.ncu is None:
        raise ProfileFormatError(f"the manifest's {record.name} pass records no ncu options", "re-run the capture")
    return record.ncu


AUTOTUNED = (
    "cuDNN's autotuner was on (torch.backends.cudnn.benchmark): every pass's process times the convolution "
    "algorithms again and may pick other kernels, so ncu's replay met other kernels than the timeline's (the mismatch "
    "above); for counters on every launch, profile with it off"
)


def _assemble(
    run_dir: RunDir, manifest: RunManifest, harness: HarnessResult, timeline: NsysWindow
) -> OperatorAttributedProfile:
    kernels: Iterable[WindowKernel] = timeline.kernels()
    counter_warnings: list[str] = []
    counter_notes: list[str] = []
    counters: Counters | None = None
    ncu_pass, variants_pass = manifest.pass_named(COUNTER_PASS), manifest.pass_named(VARIANT_PASS)
    if variants_pass is not None and not run_dir.ncu_report(VARIANT_PASS).is_file():  # it failed: the run went on
        counter_warnings += variants_pass.notes[-1:] or ["the shape-variant pass wrote no ncu report"]
        variants_pass = None
    if ncu_pass is not None and not run_dir.ncu_report(COUNTER_PASS).is_file():  # it failed: the run went on
        counter_warnings += ncu_pass.notes[-1:] or ["the ncu pass wrote no report: the profile carries no counters"]
        ncu_pass = variants_pass = None
    if ncu_pass is not None:
        options = _options(ncu_pass)
        reports = [run_dir.ncu_report(COUNTER_PASS)] + ([run_dir.ncu_report(VARIANT_PASS)] if variants_pass else [])
        with ThreadPoolExecutor(max_workers=len(reports)) as pool:
            # Each report is read in a child process: all at once, while this one reads the timeline.
            reading = [pool.submit(_read_counters, path) for path in reports]
            launches = list(kernels)  # the join looks ahead along the launches
            kernels = launches
            timeline.check_activity_tables()
            read = [future.result() for future in reading]
        (report, _), variants = read[0], (read[1][0] if variants_pass else None)
        counter_notes = report.derivation_notes()
        counter_warnings += [warning for _, warnings in read for warning in warnings]
        # no ncu pass replays a collective's (NCCL) kernel (`replayed_kernels`): its launches are none of a replay's
        replayable = [k for k in launches if not is_collective(k.mangled_name or k.name)]
        joined, problems, notes = join_counters(
            replayable, report.records, options.per_launch_config, options.filters_launches,
            variants=variants.records if variants else (),
            start=_replay_start(replayable, options),
            variants_start=_replay_start(replayable, _options(variants_pass)) if variants_pass else 0,
            truncated=ncu_pass.stopped_early is not None,
            variants_at=variants_pass.replayed_launches if variants_pass else None,
        )
        counter_warnings += [_stopped_early(p, second_pass=variants_pass is not None)
                             for p in (ncu_pass, variants_pass) if p and p.stopped_early]
        counter_warnings += [f"nsys/ncu mismatch: {p}" for p in problems] + notes
        if problems and harness.cudnn_benchmark:
            counter_warnings.append(AUTOTUNED)
        counters = lambda ordinal: joined.get(ordinal, ({}, None, None))  # noqa: E731
    tool = "nsys+ncu" if ncu_pass is not None else "nsys"
    meta = capture_metadata(manifest, harness, tool)
    meta.notes += counter_notes
    start = timeline.window_start_ns
    if not start:  # no measure range (or one at 0): the earliest window kernel
        kernels = list(kernels)
        start = min((k.start_ns for k in kernels), default=0)
    if timeline.session_start_utc_ns is not None:
        meta.window_clock_start_ns = timeline.session_start_utc_ns + start
    provenance = load_provenance(run_dir.provenance("nsys"))
    context = Context(
        timeline.sequence_index() if may_run_backward(manifest, harness) else None, timeline.forward_threads,
        harness.root_module or provenance.root_module,
    )
    operator_ids: OperatorKeys = {}
    others = OtherThreads(timeline.forward_threads)
    operators, unattributed = attribute_stream(
        others.watch(kernels), provenance, start, counters, high_confidence_links=False, context=context,
        operator_keys=operator_ids,
    )
    del kernels
    timeline.check_activity_tables()
    events = attribute_events(timeline.runtime_calls(), start, context, operator_ids,
                              [k for op in operators for k in op.kernels] + unattributed, ddp_timed(harness))
    settle_phases(operators, events)
    sites_from_graph_breaks(events, meta.graph_breaks)
    warnings = list(harness.warnings) + timeline.warnings + counter_warnings + event_warnings(events)
    if unattributed:
        warnings.append(f"{len(unattributed)} kernels could not be attributed (kept in unattributed_kernels)")
        warnings += others.warnings(unattributed)
    window = window_totals(operators, unattributed, harness.the_window.wall_time_ns)
    window.gpu_elapsed_ns = harness.the_window.gpu_elapsed_ns
    window.host_compute_ns, window.host_operators = host_compute(timeline.host_calls())
    warnings += module_coverage_warning(operators, window)
    if ncu_pass is not None:
        window.kernels_with_counters = sum(1 for op in operators for k in op.kernels if k.metrics) + sum(
            1 for k in unattributed if k.metrics
        )
        counter_coverage(window, [k for op in operators for k in op.kernels] + unattributed)
    return OperatorAttributedProfile(
        capture_metadata=meta, window=window, operators=operators, unattributed_kernels=unattributed,
        runtime_events=events, warnings=warnings,
    )
