"""Capture verbs: profile and run, map, assemble and the memory pass: a workload into a run directory, profile.json."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mcp_server.api.common import PROGRAM, Cancel
from mcp_server.assemble import write_profile
from mcp_server.backends.registry import AUTO, REGISTRY, choose_backend, pass_folders
from mcp_server.backends.registry import assemble as assemble_profile
from mcp_server.capture.leftovers import owner, stopped_beside, taken_over
from mcp_server.capture.passes import CapturingBackend
from mcp_server.capture.request import CaptureRequest, Torchrun, WorkloadOptions, check_workload
from mcp_server.capture.schedule import capture, map_counters
from mcp_server.capture.torchrun import capture_ranks
from mcp_server.errors import BackendUnavailable, ScriptSpawnsRanks, UsageError, WorkloadOutOfMemory
from mcp_server.progress import Progress, quiet
from mcp_server.queries import header, top_rows
from mcp_server.ranks.build import merge_run, write_events_of
from mcp_server.rundir import RunDir, output_folder
from mcp_server.schema.flags import cli_flags
from mcp_server.schema.requests import (
    AssembleRequest,
    Interpreter,
    MapRequest,
    MemoryRequest,
    ProfileRequest,
)
from mcp_server.schema.results import (
    InterpreterInfo,
    MemoryRun,
    ProfileRun,
)
from mcp_server.schema.types import MEMORY_LABEL, MEMORY_PASS
from plugins.executables import has_gpu

NO_COUNTERS_HERE = (
    "no hardware counters: nsys and ncu need an NVIDIA GPU with Nsight Systems and Compute here (see "
    "`operator-profiler preflight`); profiling with torch.profiler instead"
)
def profile(req: ProfileRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Capture the workload's window into a run directory and assemble profile.json; with `req.ncu`, replay
    its kernels under ncu too (the `run` verb)."""
    if req.memory and req.capture.script:
        raise UsageError("--memory needs get_model_and_input(): a script run as it is has none",
                         "drop --memory, or write the workload contract (see README)")
    chosen = choose_backend(req.backend)
    counters = req.ncu is not None and chosen.counters
    if req.ncu is not None and not counters:
        if req.require_counters:
            raise BackendUnavailable(
                "counters need the nsys backend (an NVIDIA GPU with nsys and ncu), not available here",
                "drop counters, or run on a GPU machine where `preflight` passes",
            )
        progress(f"profile: {NO_COUNTERS_HERE}")
    check_workload(req.workload, req.python.python, req.capture.script)  # before any directory is made
    run_dir = RunDir(output_folder(req.output, req.project, req.workload))
    run_dir.claimable(req.workload, pass_folders())  # a folder not ours is refused before anything is written
    cap = CaptureRequest.of(req.workload, run_dir, req.python.python, req.capture)
    label = chosen.title + (" + ncu counters" if counters else "")
    note = f"{req.backend} -> {label}" + (
        " (no NVIDIA GPU with nsys and ncu here)" if req.backend == AUTO and not chosen.counters else ""
    )
    progress(f"profile: {label} into {run_dir.path} under {req.python.python}")
    command = req.command_line or _equivalent_command(req, run_dir, counters)
    if req.memory and cap.distributed:
        raise UsageError("--memory records one process, not a torchrun launch", "drop --memory or --nproc-per-node")
    with run_dir.locked(owner("run" if counters else "profile")):
        stale = taken_over(run_dir, "profile", progress)
        stale += stopped_beside(req.project, "profile", progress) if req.output is None else []
        run_dir.claim(req.workload, pass_folders())
        try:
            cap = _capture(cap, req, chosen, command, progress, counters, cancel)
        except WorkloadOutOfMemory as exc:
            raise _diagnosed(cap, exc, progress, cancel) from None
        failed = []
        if req.memory:
            from mcp_server.memory.run import add_memory_pass

            failed = add_memory_pass(cap, progress, cancel)
        result = (_ranks_run if cap.distributed else _profile_run)(run_dir, req.python, note, req.top, progress)
    result.warnings += failed
    if req.ncu is not None and not counters:
        result.warnings.insert(0, NO_COUNTERS_HERE)
    result.warnings[:0] = stale
    return result
def _capture(cap: CaptureRequest, req: ProfileRequest, chosen: CapturingBackend, command: list[str], progress: Progress,
             counters: bool, cancel: Cancel) -> CaptureRequest:
    """Run the capture's passes (through torchrun for several ranks); a script found starting its ranks itself
    (`torch.multiprocessing.spawn`) is captured again, each process it spawns a torchrun rank. The request the
    passes ran under."""
    ncu, timing = req.ncu if counters else None, has_gpu()
    try:
        (capture_ranks if cap.distributed else capture)(cap, chosen, command, progress, ncu=ncu, cancel=cancel,
                                                       timing=timing)
    except ScriptSpawnsRanks as spawns:
        if cap.distributed:
            raise
        progress(f"profile: the script starts {spawns.ranks} processes with torch.multiprocessing.spawn; each is "
                 f"profiled as a torchrun rank (--nproc-per-node {spawns.ranks})")
        cap.run_dir.claim(req.workload, pass_folders())
        cap = replace(cap, torchrun=Torchrun(nproc_per_node=spawns.ranks))
        capture_ranks(cap, chosen, command, progress, ncu=ncu, cancel=cancel, timing=timing)
    return cap


def map_run(req: MapRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Replay a captured nsys run's kernels under ncu and rebuild its profile.json."""
    run_dir = RunDir.existing(req.run_dir)
    manifest = run_dir.read_manifest()
    if not any(b.counters for b in REGISTRY.values() if b.label == manifest.backend):
        raise UsageError(
            f"{run_dir.path} was captured with backend {manifest.backend}",
            "map needs a run captured with the nsys backend: profile with backend='nsys' (--backend nsys) on a GPU "
            "machine",
        )
    cap = CaptureRequest(
        workload=Path(manifest.workload), run_dir=run_dir, python=manifest.python, timeout_s=req.timeout_s,
        options=WorkloadOptions(compile_mode=manifest.compile_mode, warmup_iters=manifest.warmup_iters,
                                iters=manifest.iters, seed=manifest.seed, train_step=manifest.run_mode == "train_step"),
    )
    progress(f"map: ncu replay of {run_dir.path} under {manifest.python}")
    with run_dir.locked(owner("map")):
        stale = taken_over(run_dir, "map", progress)
        try:
            map_counters(cap, req.ncu, progress, cancel)
        except WorkloadOutOfMemory as exc:
            raise _diagnosed(cap, exc, progress, cancel) from None
        result = _profile_run(run_dir, Interpreter(python=manifest.python, source="manifest"),
                              "nsys+ncu: counters replayed by ncu at base clocks, durations from nsys at real clocks",
                              req.top, progress)
    result.warnings[:0] = stale
    return result
def assemble(req: AssembleRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Rebuild profile.json from a run directory's raw artifacts (no GPU, no workload)."""
    run_dir = RunDir.existing(req.run_dir)
    manifest = run_dir.read_manifest()
    progress(f"assemble: {run_dir.path}")
    if manifest.backend == MEMORY_LABEL:
        raise UsageError(f"{run_dir.path} holds the memory pass alone: it has no profile to assemble",
                         "rebuild its memory.json with `operator-profiler memory RUN_DIR` (the memory tool)")
    with run_dir.locked(owner("assemble")):
        stale = taken_over(run_dir, "assemble", progress)
        rebuild = _ranks_run if manifest.distributed is not None and run_dir.ranks() else _profile_run
        result = rebuild(run_dir, Interpreter(python=manifest.python, source="manifest"),
                         f"{manifest.backend}: rebuilt from the recorded artifacts", req.top, progress)
    result.warnings[:0] = stale
    return result
def _diagnosed(cap: CaptureRequest, exc: WorkloadOutOfMemory, progress: Progress, cancel: Cancel
               ) -> WorkloadOutOfMemory:
    """A pass ran out of memory: the error with what held the memory (the memory pass, run up to the failure)."""
    from mcp_server.memory.run import diagnose_out_of_memory

    return diagnose_out_of_memory(cap, exc, progress, cancel)
def _ranks_run(run_dir: RunDir, interp: Interpreter, note: str, top: int, progress: Progress) -> ProfileRun:
    """Assemble every rank's profile.json and events, merge them into ranks.json; the first rank's digest with
    the merged view, naming every file of the run."""
    results = []
    for rank in run_dir.ranks():
        progress(f"rank {rank}: assembling profile.json")
        results.append(_profile_run(run_dir.rank_dir(rank), interp, note, top, progress))
    progress(f"merging {len(results)} ranks' events into ranks.json (DuckDB)")
    merged = merge_run(run_dir)
    first = results[0]
    return first.model_copy(update={
        "run_dir": str(run_dir.path), "manifest_path": str(run_dir.manifest_path), "files": run_dir.files(),
        "ranks_path": str(run_dir.ranks_path), "ranks": merged,
    })
def _profile_run(run_dir: RunDir, interp: Interpreter, note: str, top: int, progress: Progress) -> ProfileRun:
    """Assemble and write the run's profile.json; the result naming every file of the run."""
    progress("assembling profile.json")
    profile = assemble_profile(run_dir)
    path = write_profile(run_dir.profile_path, profile)
    write_events_of(run_dir, profile)
    memory_path = None
    if run_dir.read_manifest().pass_named(MEMORY_PASS) is not None and run_dir.memory_record().is_file():
        from mcp_server.memory.run import write_memory

        progress("building memory.json")
        write_memory(run_dir)
        memory_path = str(run_dir.memory_path)
    meta = profile.capture_metadata
    if not meta.gpu_used:
        note += "; NO GPU USED: CUDA was not available to the workload, so times are CPU operator times"
    return ProfileRun(
        run_dir=str(run_dir.path), profile_path=str(path), manifest_path=str(run_dir.manifest_path),
        files=run_dir.files(), backend=run_dir.read_manifest().backend, backend_note=note,
        interpreter=InterpreterInfo(python=interp.python, source=interp.source, executable=meta.python_executable,
                                    torch_version=meta.torch_version),
        profile=header(profile, path), window=profile.window, top_operators=top_rows(profile, top),
        unattributed_kernel_count=len(profile.unattributed_kernels), warnings=profile.warnings, notes=meta.notes,
        memory_path=memory_path,
    )
def _equivalent_command(req: ProfileRequest, run_dir: RunDir, counters: bool) -> list[str]:
    """The CLI command that captures what `req` asks for, as the manifest records it."""
    script_args = req.capture.script_args  # after `--`: they may start with `-` themselves
    command = [PROGRAM, "run" if counters else "profile", str(req.workload), "--backend", req.backend,
               "--python", req.python.python, "--output", str(run_dir.path),
               *cli_flags(req.capture.model_copy(update={"script_args": ()}))]
    command += ["--memory"] if req.memory else []
    command += cli_flags(req.ncu) if counters and req.ncu is not None else []
    return command + (["--", *script_args] if script_args else [])
def memory(req: MemoryRequest, progress: Progress = quiet, cancel: Cancel = None) -> MemoryRun:
    """Where every byte at the window's peak comes from: the memory pass of a workload (memory.json, its chart, the
    allocator's snapshot), or memory.json rebuilt from a run directory's memory pass (no GPU)."""
    from mcp_server.memory.run import memory as run_memory

    return run_memory(req, progress, cancel)
