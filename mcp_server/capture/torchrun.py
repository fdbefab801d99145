"""The multi-rank capture: every pass launched once through torchrun, each rank's harness writing its own run
directory (`rank<R>/`), one pass after another (each rank has its GPU to itself, so no lock takes turns).

torchrun is the launcher (`python -m torch.distributed.run`, under the workload's interpreter), so multi-node
runs work as torchrun does; profilers wrap each rank (`torchrun --no-python nsys profile ... python harness`),
their outputs named per rank through `%q{RANK}`. ncu replays each rank's kernels but the collectives: replaying
an NCCL kernel on one rank would wait for peers that are not replaying it. When a rank fails, torchrun stops the
others; the error names the rank.
"""

from __future__ import annotations

import time
from dataclasses import replace

from mcp_server.capture.passes import (
    Cancel,
    CapturingBackend,
    PassProgress,
    exported_timeline,
    raise_for_harness,
    require_ncu,
)
from mcp_server.capture.plan import TIMING_WINDOWS
from mcp_server.capture.request import CaptureRequest, harness_command
from mcp_server.capture.schedule import new_manifest
from mcp_server.errors import BackendUnavailable, CaptureFailed, ProfilerError, UsageError
from mcp_server.process import interpreter_env, now_iso, run_child
from mcp_server.process.bytecode import precompile_notes, precompile_workers, precompiling
from mcp_server.process.child import exit_description, log_tail
from mcp_server.progress import Progress, quiet, tagged
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult, load_harness
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import COUNTER_PASS, TIMING_PASS, PassName
from plugins.executables import gpu_name
from plugins.ncu.command import capture_command as ncu_capture
from plugins.ncu.command import replay_env
from plugins.nsys.command import capture_command as nsys_capture
from plugins.nsys.command import find_nsys

# torchrun's launch options as the manifest records them (by name)
TORCHRUN_FIELDS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id")
RANK_TEMPLATE = "%q{RANK}"  # expanded by nsys, ncu and the harness from each rank's environment
EVERY_KERNEL = ".*"  # a rank's replay, filtered to every kernel but the collectives (`replayed_kernels`)
NCCL_EXCLUDED_NOTE = ("NCCL (collective) kernels were left out of ncu's replay: replaying one on a single rank would "
                      "wait for peers that are not replaying it; they keep their nsys durations, without counters")


def torchrun_command(req: CaptureRequest) -> list[str]:
    """torchrun under the workload's interpreter, with the launch options of `req`; one node with no rendezvous
    given is `--standalone` (torchrun picks a free port). Its entry point is the command that follows."""
    assert req.torchrun is not None
    cmd = [req.python, "-m", "torch.distributed.run", "--nproc-per-node", str(req.torchrun.nproc_per_node)]
    given = req.torchrun.launch_flags()
    if not given or all(flag == "--nnodes" and value == "1" for flag, value in given):
        cmd.append("--standalone")
    for flag, value in given:
        cmd += [flag, str(value)]
    return [*cmd, "--max-restarts", "0", "--no-python"]


def local_ranks(req: CaptureRequest) -> list[int]:
    """The global ranks this node runs (torchrun numbers them node by node)."""
    assert req.torchrun is not None
    first = (req.torchrun.node_rank or 0) * req.torchrun.nproc_per_node
    return list(range(first, first + req.torchrun.nproc_per_node))


def check_world(req: CaptureRequest, gpus: int) -> None:
    """On a GPU machine every rank of this node needs its own GPU; else a one-line error with the remedy."""
    launch = req.torchrun
    if launch is not None and gpus and launch.nproc_per_node > gpus and launch.dist_backend != "gloo":
        raise UsageError(
            f"--nproc-per-node {launch.nproc_per_node} asks for more ranks than this node's {gpus} GPU(s)",
            f"pass --nproc-per-node {gpus} or fewer (one rank per GPU)",
        )


def capture_ranks(
    req: CaptureRequest,
    backend: CapturingBackend,
    command_line: list[str],
    progress: Progress = quiet,
    ncu: NcuOptions | None = None,
    cancel: Cancel = None,
    timing: bool = False,
) -> RunManifest:
    """Run each pass through torchrun, each rank into `rank<R>/`; write every rank's manifest and the run's.

    The backend's main pass (torch.profiler, or nsys's timeline), then with `timing` the no-profiler timing pass,
    then with `ncu` (a backend with counters) the ncu replay without the collectives. Where the ranks' interpreter
    gets the bytecode cache and none is cached, the bytecode they import is compiled beside the passes, as for one
    process (`precompiling`). Returns the run's manifest."""
    req.check()
    req.run_dir.prepare()
    manifest = new_manifest(req, backend.label, command_line, backend.tools())
    check_world(req, int(manifest.gpu.get("count", 0)))
    ranks = local_ranks(req)
    launch = req.torchrun
    assert launch is not None
    manifest.distributed = {
        "nproc_per_node": launch.nproc_per_node, "ranks": ranks, "dist_backend": launch.dist_backend,
        **{name: getattr(launch, name) for name in TORCHRUN_FIELDS if getattr(launch, name) is not None},
    }
    req.run_dir.write_manifest(manifest)
    per_rank: dict[int, list[PassRecord]] = {r: [] for r in ranks}
    progress(f"{len(ranks)} ranks through torchrun: {' '.join(torchrun_command(req)[:4])} ...")

    def done(records: dict[int, PassRecord]) -> None:
        for rank, record in records.items():
            per_rank[rank].append(record)
        _write_manifests(req.run_dir, manifest, per_rank)

    with precompiling(req.python, req.workload, req.run_dir.bytecode_log, req.compile_mode != "eager",
                      tagged("bytecode", progress), workers=precompile_workers(passes=len(ranks))) as precompile:
        try:
            done(backend.run_ranks(req, ranks, progress, cancel))
            if timing:
                timed = req.with_turn(windows=TIMING_WINDOWS)
                done(rank_pass(timed, ranks, TIMING_PASS, "kernels", [], progress, cancel))
            if ncu is not None and backend.counters:
                done(_ncu_ranks(req, ranks, ncu, progress, cancel))
        except ProfilerError:
            _write_manifests(req.run_dir, manifest, per_rank)
            raise
    if notes := precompile_notes(precompile, req.run_dir.path, "the ranks' passes"):
        manifest.notes += notes
        _write_manifests(req.run_dir, manifest, per_rank)
    return manifest


def _ncu_ranks(req: CaptureRequest, ranks: list[int], ncu: NcuOptions, progress: Progress,
               cancel: Cancel) -> dict[int, PassRecord]:
    """The ncu pass on every rank, the collectives left out (as every ncu pass leaves them); each rank's report moved
    into its folder. Each rank's replay is joined to its timeline as a filtered one (`EVERY_KERNEL`): joined launch
    for launch, a two-rank DDP step's on two H200s disagreed with its timeline from the first launch (141 passed
    over, 60 without counters)."""
    options = ncu if ncu.kernel_regex else ncu.model_copy(update={"kernel_regex": EVERY_KERNEL})
    # ncu takes `%q{RANK}` in a file's name only, not in its folder: each report is moved to its rank's
    prefix = ncu_capture(require_ncu(), req.run_dir.path / f"ncu.rank{RANK_TEMPLATE}", options,
                         req.compile_mode == "cudagraphs", gpu_name())
    records = rank_pass(req.with_turn(pageable_batches=True), ranks, COUNTER_PASS, "nvtx", prefix, progress, cancel,
                        replaying=True)
    for rank, record in records.items():
        record.ncu = options
        record.notes.append(NCCL_EXCLUDED_NOTE)
        written, report = req.run_dir.path / f"ncu.rank{rank}.ncu-rep", req.run_dir.rank_dir(rank).ncu_report()
        if not written.is_file():
            raise CaptureFailed(f"rank {rank}: ncu wrote no report", f"read {req.run_dir.torchrun_log(COUNTER_PASS)}")
        written.replace(report)
        record.artifacts.append(req.run_dir.rank_dir(rank).relative(report))
    return records


def _write_manifests(run_dir: RunDir, manifest: RunManifest, per_rank: dict[int, list[PassRecord]]) -> None:
    """Each rank's manifest (its passes, artifacts relative to its folder) and the run's (rank 0's passes, each
    pass's folder named under rank0/)."""
    for rank, records in per_rank.items():
        own = manifest.model_copy(deep=True)
        own.distributed = {**(manifest.distributed or {}), "rank": rank}
        own.passes = records
        run_dir.rank_dir(rank).write_manifest(own)
    first = min(per_rank)
    top = manifest.model_copy(deep=True)
    top.passes = [r.model_copy(update={"directory": f"rank{first}/{r.directory}",
                                       "artifacts": [f"rank{first}/{a}" for a in r.artifacts]})
                  for r in per_rank[first]]
    run_dir.write_manifest(top)


def nsys_ranks(req: CaptureRequest, ranks: list[int], progress: Progress, cancel: Cancel) -> dict[int, PassRecord]:
    """The nsys pass on every rank, then each rank's report exported to SQLite."""
    nsys = find_nsys()
    if nsys is None:
        raise BackendUnavailable("nsys not found", "install Nsight Systems or set NSYS=/path/to/nsys")
    prefix = nsys_capture(nsys, req.run_dir.rank_dir(RANK_TEMPLATE).nsys_report_base())
    records = rank_pass(req, ranks, "nsys", "nvtx", prefix, progress, cancel)
    for rank, record in records.items():
        exported_timeline(nsys, req.run_dir.rank_dir(rank), record, req.timeout_s, progress, cancel, f"rank {rank}: ")
    return records


def torch_ranks(req: CaptureRequest, ranks: list[int], progress: Progress, cancel: Cancel) -> dict[int, PassRecord]:
    """The torch.profiler pass on every rank."""
    return rank_pass(req, ranks, "torch", "torch", [], progress, cancel)


def rank_pass(
    req: CaptureRequest, ranks: list[int], name: PassName, profiler: str, prefix: list[str],
    progress: Progress = quiet, cancel: Cancel = None, replaying: bool = False,
) -> dict[int, PassRecord]:
    """Run pass `name` once through torchrun (`prefix` wraps each rank; `replaying` under ncu: its environment);
    every rank's record.

    A rank that failed is named with its error (the first in rank order, torchrun having stopped the others);
    a launch that left no rank's result says how torchrun ended, with the last lines it printed."""
    template = replace(req, run_dir=req.run_dir.rank_dir(RANK_TEMPLATE))
    for rank in ranks:
        own = req.run_dir.rank_dir(rank)
        own.pass_dir(name).mkdir(parents=True, exist_ok=True)
        own.harness_result(name).unlink(missing_ok=True)
    cmd = [*torchrun_command(req), *prefix, *harness_command(template, profiler, name)]
    log = req.run_dir.torchrun_log(name)
    progress(f"{name} pass: {len(ranks)} ranks")
    started, t0 = now_iso(), time.monotonic()
    env = interpreter_env(req.python)
    code, timed_out = run_child(cmd, log, req.timeout_s, PassProgress(name, progress), cancel,
                                env=replay_env(env) if replaying else env)
    wall = time.monotonic() - t0
    if timed_out:
        raise CaptureFailed(f"the {name} pass ran past its {req.timeout_s:.0f} s limit: every rank was stopped",
                            "raise --timeout; a rank waiting in a collective for a peer that never came hangs")
    results = {rank: load_harness(req.run_dir.rank_dir(rank).harness_result(name)) for rank in ranks}
    for rank, result in results.items():
        if result is not None and not result.ok:
            _raise_for_rank(req, rank, name, result)
    missing = [rank for rank, result in results.items() if result is None]
    if missing:
        tail = log_tail(log)
        raise CaptureFailed(
            f"the {name} pass: rank(s) {', '.join(map(str, missing))} ended before writing their results (torchrun "
            f"{exit_description(code)})" + (f" (last lines: {tail})" if tail else ""), f"read {log}")
    records = {}
    for rank, result in results.items():
        own = req.run_dir.rank_dir(rank)
        record = PassRecord(name=name, profiler=profiler, command=cmd, directory=name, started_at=started,
                            wall_time_s=round(wall, 3), exit_code=code)
        assert result is not None
        record.artifacts = [own.relative(own.harness_result(name))] + [
            f"{name}/{artifact}" for artifact in result.artifacts]
        records[rank] = record
    return records


def _raise_for_rank(req: CaptureRequest, rank: int, name: PassName, result: HarnessResult) -> None:
    """The harness error of one rank, its message prefixed with the rank."""
    try:
        raise_for_harness(result, replace(req, run_dir=req.run_dir.rank_dir(rank)), name)
    except ProfilerError as exc:
        remedy = exc.remedy
        if "full output in" in remedy:
            remedy = f"fix the workload; every rank's output is in {req.run_dir.torchrun_log(name)}"
        raise type(exc)(f"rank {rank}: {exc.message}", remedy) from exc
