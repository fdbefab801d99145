"""The memory verb and the diagnosis of an out-of-memory error: run the memory pass, write memory.json and its
chart, and say what held the memory.

`memory WORKLOAD` runs the memory pass alone into a run directory; `memory RUN_DIR` rebuilds memory.json from a
run's raw files; `run --memory` adds the pass after the others. When a pass of `profile`, `run` or `map` runs out
of memory, the memory pass runs the workload again with the allocator's history on, up to the same failure, and the
error carries the one screen that says what was being allocated where, what held the memory and what to change.
"""

from __future__ import annotations

from pathlib import Path

from mcp_server.backends.registry import pass_folders
from mcp_server.capture.memory import capture_memory, check_memory_request, memory_pass
from mcp_server.capture.passes import Cancel
from mcp_server.capture.request import CaptureRequest
from mcp_server.errors import ProfilerError, WorkloadOutOfMemory
from mcp_server.memory.build import build_memory
from mcp_server.memory.chart import timeline_chart
from mcp_server.memory.text import memory_lines, oom_lines
from mcp_server.memory.units import size
from mcp_server.progress import Progress, quiet
from mcp_server.rundir import RunDir, dropped_if_empty, output_folder
from mcp_server.schema.flags import cli_flags
from mcp_server.schema.harness import load_harness
from mcp_server.schema.io import read_model, write_model_atomic
from mcp_server.schema.manifest import PassRecord
from mcp_server.schema.memory import MemoryProfile
from mcp_server.schema.requests import MemoryRequest
from mcp_server.schema.results import MemoryRun
from mcp_server.schema.types import MEMORY_PASS
from plugins.executables import has_gpu

PROGRAM = "operator-profiler"


def write_memory(run_dir: RunDir) -> tuple[MemoryProfile, Path | None]:
    """Build and write the run's memory.json and its timeline chart (None when the timeline is too short)."""
    profile = build_memory(run_dir)
    write_model_atomic(run_dir.memory_path, profile)
    return profile, timeline_chart(profile, run_dir.memory_chart)


def load_memory(folder: Path) -> MemoryProfile | None:
    """memory.json in `folder` (a run directory, or the folder of its profile.json), if there is one."""
    path = Path(folder) / RunDir(folder).memory_path.name
    if not path.is_file():
        return None
    return read_model(path, MemoryProfile, "memory.json", "rebuild it: `operator-profiler memory RUN_DIR`")


def memory(req: MemoryRequest, progress: Progress = quiet, cancel: Cancel = None) -> MemoryRun:
    """Capture the memory pass of a workload into a run directory, or rebuild a run directory's memory.json."""
    if Path(req.target).is_dir():
        run_dir = RunDir.existing(req.target)
        progress(f"memory: rebuilding memory.json of {run_dir.path}")
        with run_dir.locked():
            profile, chart = write_memory(run_dir)
        return _result(run_dir, profile, chart, run_dir.read_manifest().python, req.top)
    probe = CaptureRequest.of(Path(req.target), RunDir(req.project), req.python.python, req.capture)
    check_memory_request(probe)  # before any directory is made
    with dropped_if_empty(output_folder(req.output, req.project, Path(req.target), "memory")) as folder:
        run_dir = RunDir(folder)
        cap = CaptureRequest.of(Path(req.target), run_dir, req.python.python, req.capture)
        command = req.command_line or [PROGRAM, "memory", str(req.target), "--python", req.python.python,
                                       "--output", str(run_dir.path), *cli_flags(req.capture)]
        progress(f"memory: the allocator's history of {req.target} into {run_dir.path} under {req.python.python}")
        with run_dir.locked():
            run_dir.claim(Path(req.target), pass_folders())
            try:
                capture_memory(cap, command, progress, cancel)
            except WorkloadOutOfMemory as exc:
                raise diagnosed(exc, run_dir) from None
            progress("memory: building memory.json")
            profile, chart = write_memory(run_dir)
    return _result(run_dir, profile, chart, req.python.python, req.top)


def _result(run_dir: RunDir, profile: MemoryProfile, chart: Path | None, python: str, top: int) -> MemoryRun:
    peak = profile.oom.held if profile.oom is not None and profile.oom.held is not None else profile.at_peak
    lines = (oom_lines(profile, profile.oom, run_dir.memory_path, run_dir.memory_snapshot())
             if profile.oom is not None else memory_lines(profile, run_dir.memory_path, top))
    harness = load_harness(run_dir.harness_result(MEMORY_PASS))
    torch_version = harness.environment.get("torch_version") if harness is not None else None
    return MemoryRun(
        run_dir=str(run_dir.path), memory_path=str(run_dir.memory_path), chart_path=str(chart) if chart else None,
        snapshot_path=str(run_dir.memory_snapshot()), python=python, torch_version=torch_version,
        peak_allocated_bytes=profile.peak_allocated_bytes, peak_reserved_bytes=profile.peak_reserved_bytes,
        attributed_pct=peak.attributed_pct if peak is not None else None,
        findings=[f"{f.title}: up to {size(f.saving_bytes)} ({f.estimate}). {f.change}" for f in profile.findings],
        summary="\n".join(lines),
    )


def diagnosed(exc: WorkloadOutOfMemory, run_dir: RunDir) -> WorkloadOutOfMemory:
    """The out-of-memory error with its diagnosis, when the memory pass recorded the failure: memory.json is written
    and the error's first line and details are the one screen."""
    if not run_dir.memory_record().is_file():
        return exc
    profile, _ = write_memory(run_dir)
    if profile.oom is None:
        return exc
    screen = oom_lines(profile, profile.oom, run_dir.memory_path, run_dir.memory_snapshot())
    error = WorkloadOutOfMemory(screen[0], "lower the peak as below, or run on a GPU with more memory")
    error.details, error.records = screen[1:], exc.records
    return error


def _record(run_dir: RunDir, records: list[PassRecord]) -> None:
    with run_dir.updating_manifest() as manifest:
        manifest.passes = [p for p in manifest.passes if p.name != MEMORY_PASS] + records


def add_memory_pass(cap: CaptureRequest, progress: Progress = quiet, cancel: Cancel = None) -> list[str]:
    """`run --memory`: the memory pass after the others, recorded in the manifest; its failure is a warning (the
    profile still assembles), returned."""
    if not has_gpu():
        return ["no memory pass: it records the CUDA caching allocator, and there is no NVIDIA GPU here"]
    try:
        record = memory_pass(cap, progress, cancel)
    except ProfilerError as exc:
        _record(cap.run_dir, [r for r in exc.records if isinstance(r, PassRecord)])
        progress(f"memory pass: failed, the profile goes on without memory.json: {exc.message}")
        return [f"the memory pass failed: {exc.one_line()}"]
    _record(cap.run_dir, [record])
    return []


def diagnose_out_of_memory(cap: CaptureRequest, exc: WorkloadOutOfMemory, progress: Progress = quiet,
                           cancel: Cancel = None) -> WorkloadOutOfMemory:
    """A pass ran out of memory: run the memory pass (same workload and options) up to the same failure and return
    the error with what held the memory; the original error where that cannot run."""
    if cap.distributed or not has_gpu():
        return exc
    progress("out of memory: running the memory pass to see what held the memory")
    try:
        record = memory_pass(cap, progress, cancel)
    except WorkloadOutOfMemory as again:
        _record(cap.run_dir, [r for r in again.records if isinstance(r, PassRecord)])
        found = diagnosed(again, cap.run_dir)
        found.records = exc.records
        return found
    except ProfilerError as failed:
        exc.details = [f"the memory pass that would show what held the memory failed: {failed.one_line()}"]
        return exc
    _record(cap.run_dir, [record])
    profile, _ = write_memory(cap.run_dir)
    exc.details = ["the memory pass did not run out of memory (the other passes' processes shared the GPU, or the "
                   "workload is not deterministic); its window:", *memory_lines(profile, cap.run_dir.memory_path)]
    return exc
