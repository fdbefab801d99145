"""Capture metadata: what was asked (the manifest) and what the workload's process saw (the harness's result)."""

from __future__ import annotations

from mcp_server.errors import ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult, load_harness
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import CaptureMetadata, Clocks, GraphBreak
from mcp_server.schema.types import PassName

CPU_ONLY_NOTE = "No GPU was used: CUDA was not available to the workload, so this profile holds CPU operator times."


def harness_result(run_dir: RunDir, name: PassName) -> HarnessResult:
    """The harness's result of pass `name`, or a ProfileFormatError when the run directory lacks it."""
    path = run_dir.harness_result(name)
    result = load_harness(path)
    if result is None:
        raise ProfileFormatError(f"missing {path}", "the run directory is incomplete; re-run the capture")
    return result


def may_run_backward(manifest: RunManifest, harness: HarnessResult) -> bool:
    """Whether the window can hold backward work (a training step, or a script's own window)."""
    return manifest.run_mode == "train_step" or harness.may_run_backward


def graph_breaks(harness: HarnessResult) -> list[GraphBreak] | None:
    """The graph breaks the harness recorded while compiling (None when it compiled nothing)."""
    found = harness.graph_breaks
    if found is None:
        return None
    return [GraphBreak(reason=b.get("reason", "unknown"), location=b.get("location", "unknown"),
                       compile_id=b.get("compile_id"), detail=b.get("detail")) for b in found]


def capture_metadata(manifest: RunManifest, harness: HarnessResult, tool: str) -> CaptureMetadata:
    """Capture metadata from the manifest (what was asked) and the harness (what the child saw)."""
    env = harness.environment
    gpu = manifest.gpu
    clocks = Clocks()
    if gpu.get("clocks_sm_mhz"):
        clocks = Clocks(
            sm_clock_mhz=float(gpu["clocks_sm_mhz"]),
            memory_clock_mhz=float(gpu["clocks_mem_mhz"]) if gpu.get("clocks_mem_mhz") else None,
            source="nvidia-smi at capture",
        )
    gpu_used = bool(env.get("cuda_available"))
    return CaptureMetadata(
        tool=tool, gpu_used=gpu_used, device_name=env.get("device_name") or ("cpu" if not gpu_used else None),
        device_type="cuda" if gpu_used else "cpu", sm_count=env.get("sm_count"),
        compute_capability=env.get("compute_capability"), total_memory_bytes=env.get("total_memory_bytes"),
        driver_version=gpu.get("driver_version"), cuda_version=env.get("cuda_version"),
        torch_version=env.get("torch_version", "unknown"), python_version=env.get("python_version", "unknown"),
        python_executable=env.get("python_executable", manifest.python), hostname=env.get("hostname"),
        workload=manifest.workload, compile_mode=manifest.compile_mode, run_mode=manifest.run_mode,
        warmup_iters=manifest.warmup_iters, iters=manifest.iters, seed=manifest.seed,
        command_line=manifest.command_line, started_at=manifest.created_at,
        finished_at=str(getattr(harness, "finished_at", None) or manifest.created_at), clocks=clocks,
        tool_versions=manifest.tool_versions, notes=[] if gpu_used else [CPU_ONLY_NOTE],
        graph_breaks=graph_breaks(harness), cuda_graph_trees=harness.cuda_graph_trees,
        cudnn_benchmark=harness.cudnn_benchmark, root_module=harness.root_module,
        varying_inputs=harness.varying_inputs or None,
    )
