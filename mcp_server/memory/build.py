"""memory.json from a run directory's memory pass: a pure function of its files (the two pickled snapshots, the
harness's record, the manifest), rebuilt by `assemble` and `memory RUN_DIR` without a GPU."""

from __future__ import annotations

from collections.abc import Callable

from mcp_server.errors import ProfileFormatError
from mcp_server.memory.attribute import Ops, Phases, attribute, site, user_frames
from mcp_server.memory.findings import Peak, findings
from mcp_server.memory.moments import moment, phase_spans, timeline
from mcp_server.memory.replay import Replay, Step, clock_offset_us, replay, trace_start
from mcp_server.memory.snapshot import device_state, device_trace, load_snapshot
from mcp_server.rundir import RunDir
from mcp_server.schema.io import read_model
from mcp_server.schema.memory import MemoryMoment, MemoryProfile, MemoryRecord, OomDiagnosis
from mcp_server.schema.types import MEMORY_PASS, CompileMode, RunMode

REMEDY = "re-run the memory pass (`operator-profiler memory WORKLOAD`)"
FRAMES_SHOWN = 6


def read_record(run_dir: RunDir) -> MemoryRecord:
    """The memory pass's record, validated."""
    return read_model(run_dir.memory_record(), MemoryRecord, "memory record", REMEDY)


def build_memory(run_dir: RunDir) -> MemoryProfile:
    """memory.json's content for the run directory's memory pass."""
    manifest = run_dir.read_manifest()
    if manifest.pass_named(MEMORY_PASS) is None and not run_dir.memory_record().is_file():
        raise ProfileFormatError(f"{run_dir.path} holds no memory pass",
                                 "capture one: `operator-profiler memory WORKLOAD` or `run --memory`")
    record = read_record(run_dir)
    start, end = load_snapshot(run_dir.memory_snapshot(start=True)), load_snapshot(run_dir.memory_snapshot())
    device = record.device
    entries = device_trace(end, device)
    entries = entries[trace_start(entries, record.start_snapshot_ns // 1000 if record.start_snapshot_ns else None,
                                  record.history_cleared):]
    offset = clock_offset_us(entries, record.markers, record.marker_bytes)
    replayed = replay(device_state(start, device), entries, device_state(end, device), record.marker_bytes, offset)
    window = record.window
    failure = record.oom is not None
    origin_ns = window[0] if window is not None else record.start_snapshot_ns or 0
    attributed = attribute(replayed.blocks, record, None if failure else (window[1] if window else None))
    by_block = {id(a.block): a for a in attributed}
    ops, phases = Ops(record), Phases(record)

    def at(step: Step) -> MemoryMoment:
        live = [by_block[id(b)] for b in replayed.live(step.index)]
        op = ops.at(step.time_us)
        return moment(live, step.time_us - origin_ns // 1000, op.phase if op else phases.at(step.time_us * 1000),
                      op.label if op else None, op.module if op else None)

    window_us = (window[1] - window[0]) // 1000 if window is not None else 0
    start_us = window[0] // 1000 if window is not None else None
    end_us = window[1] // 1000 if window is not None and not failure else None
    peak = replayed.peak(start_us, end_us)
    at_peak = at(peak)
    stats = record.stats
    profile = MemoryProfile(
        workload=manifest.workload, compile_mode=record.compile_mode or manifest.compile_mode,
        run_mode=record.run_mode or manifest.run_mode, device_name=record.device_name,
        device_total_bytes=record.total_memory, window_us=window_us,
        peak_allocated_bytes=stats.get("allocated_bytes.all.peak"),
        peak_reserved_bytes=stats.get("reserved_bytes.all.peak"),
        peak_requested_bytes=stats.get("requested_bytes.all.peak"), replayed_peak_bytes=peak.allocated,
        at_peak=at_peak, timeline=timeline(replayed.steps, origin_ns // 1000, start_us, end_us, peak),
        phases=phase_spans(record, origin_ns), trace_entries=replayed.entries,
        unmatched_frees=replayed.unmatched_frees, clock_offset_us=offset,
        artifacts={name: run_dir.relative(path) for name, path in (
            ("snapshot", run_dir.memory_snapshot()), ("snapshot_start", run_dir.memory_snapshot(start=True)),
            ("record", run_dir.memory_record()))},
        notes=_notes(record, replayed, manifest.compile_mode, manifest.run_mode),
    )
    peak_live = [by_block[id(b)] for b in replayed.live(peak.index)]
    inherited = sum(a.block.bytes for a in peak_live if a.inherited)
    if inherited:
        profile.notes.append(f"{inherited} bytes live at the peak were made by operators outside every module (a "
                             "loss, say), and are attributed to the module whose output those operators read")
    profile.findings = findings(Peak(peak_live, at_peak.live_bytes, profile.peak_allocated_bytes,
                                     profile.peak_reserved_bytes))
    if failure:
        profile.oom = _oom(record, replayed, ops, at)
    return profile


def _oom(record: MemoryRecord, replayed: Replay, ops: Ops, at: Callable[[Step], MemoryMoment]) -> OomDiagnosis:
    """The failed request (from the trace's `oom` entry, else the observer's numbers) and what held the memory."""
    info = record.oom or {}
    failed = replayed.oom
    when_us = failed.time_us if failed is not None else (_int(info.get("time_ns")) or 0) // 1000
    op = ops.at(when_us) if when_us else None
    frames = failed.frames if failed is not None else []
    mine = user_frames(frames, record.library_roots)
    before = [s for s in replayed.steps if s.index < failed.index] if failed is not None else replayed.steps
    held = at(before[-1]) if before else None
    return OomDiagnosis(
        stage=str(info.get("stage")) if info.get("stage") else None,
        requested_bytes=failed.requested if failed is not None else _int(info.get("requested")),
        device_free_bytes=failed.device_free if failed is not None else _int(info.get("device_free")),
        device_total_bytes=_int(info.get("device_total")) or record.total_memory,
        phase=op.phase if op is not None else None, operator=op.label if op is not None else None,
        module=op.module if op is not None else None,
        call_site=site(mine[0]) if mine else (op.call_site if op is not None else None),
        frames=[f"{f.get('name')} ({site(f)})" for f in (mine or frames)[:FRAMES_SHOWN]],
        message=str(info["message"]) if info.get("message") else None, held=held,
    )


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, (int, str)) and str(value).lstrip("-").isdigit() else None


def _notes(record: MemoryRecord, replayed: Replay, compile_mode: CompileMode, run_mode: RunMode) -> list[str]:
    notes = []
    if compile_mode != "eager":
        notes.append(f"{compile_mode}: allocations inside a compiled graph are attributed to the compiled model "
                     f"({record.root_module}) as a whole, not to its submodules or operators")
    if record.cublas_workspaces_cleared:
        notes.append("cuBLAS's workspaces were released before the window, so their allocation inside its first "
                     "GEMM shows as workspace")
    if replayed.unmatched_frees:
        notes.append(f"{replayed.unmatched_frees} frees of blocks the history never showed allocated were ignored "
                     "(the history's ring buffer overflowed, or another pool freed them)")
    if run_mode == "inference":
        notes.append("inference: the window's forward runs under no_grad, so nothing is saved for backward")
    return notes
