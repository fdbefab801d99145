"""The memory pass: the harness under `--profiler memory`, which records the CUDA caching allocator's history over
the measured window (children/memory.py), in the same harness, compile mode and run mode as every other pass.

It runs alone on the GPU, after every other pass of the run has ended (their processes gone), so that neither
the timing pass's window nor another pass's memory shares the device with it; it takes the run's GPU lock all the
same. History recording slows each allocation, which is why it is a pass of its own.
"""

from __future__ import annotations

from dataclasses import replace

from mcp_server.capture.passes import Cancel, run_pass
from mcp_server.capture.request import CaptureRequest, GpuTurn
from mcp_server.capture.schedule import new_manifest
from mcp_server.children.contract import CONTRACT
from mcp_server.errors import BackendUnavailable, ProfilerError, UsageError, WorkloadError
from mcp_server.progress import Progress, quiet
from mcp_server.schema.manifest import PassRecord, RunManifest
from mcp_server.schema.types import MEMORY_LABEL, MEMORY_PASS
from plugins.executables import has_gpu

NO_GPU = ("the memory pass records the CUDA caching allocator: no NVIDIA GPU here (nvidia-smi not found)",
          "run it on a machine with an NVIDIA GPU, under an interpreter whose torch has CUDA")


def check_memory_request(req: CaptureRequest) -> None:
    """Reject what the memory pass cannot record, before anything runs: no GPU, a script workload, several ranks."""
    if not has_gpu():
        raise BackendUnavailable(*NO_GPU)
    req.check()
    if req.options.script or not CONTRACT.search(req.workload.read_text(encoding="utf-8", errors="replace")):
        raise WorkloadError(f"{req.workload} marks its own window (NvtxCapture): the memory pass needs "
                            "get_model_and_input()", "add `def get_model_and_input(): return model, inputs`")
    if req.distributed:
        raise UsageError("the memory pass records one process, not a torchrun launch",
                         "drop --nproc-per-node (and the other torchrun options) for the memory pass")


def memory_pass(req: CaptureRequest, progress: Progress = quiet, cancel: Cancel = None) -> PassRecord:
    """Run the memory pass into its folder of the run directory, holding the run's GPU lock for its window."""
    run_dir = req.run_dir
    done = run_dir.window_done(MEMORY_PASS)
    warmup = req.options.warmup_iters if req.compile_mode == "cudagraphs" else min(req.options.warmup_iters, 1)
    recorded = replace(req, turn=GpuTurn(lock=run_dir.gpu_lock, done=done)).with_options(warmup_iters=warmup)
    progress("memory pass: recording the CUDA caching allocator's history over the window")
    try:
        record, _ = run_pass(recorded, MEMORY_PASS, "memory", progress=progress, cancel=cancel)
    finally:
        for marker in (done, run_dir.gpu_lock):
            marker.unlink(missing_ok=True)
    if warmup != req.options.warmup_iters:
        record.notes.append(f"warmed up {warmup} iteration(s): the allocator's state is steady after the first "
                            "(optimizer state created, cuBLAS's workspace allocated)")
    return record


def capture_memory(req: CaptureRequest, command_line: list[str], progress: Progress = quiet,
                   cancel: Cancel = None) -> RunManifest:
    """A run of the memory pass alone (the `memory` verb): manifest.json with its record, written also when it fails."""
    run_dir = req.run_dir.prepare()
    manifest = new_manifest(req, MEMORY_LABEL, command_line)
    run_dir.write_manifest(manifest)
    try:
        manifest.passes.append(memory_pass(req, progress, cancel))
    except ProfilerError as exc:
        manifest.passes += [r for r in exc.records if isinstance(r, PassRecord)]
        run_dir.write_manifest(manifest)
        raise
    run_dir.write_manifest(manifest)
    return manifest
