"""Assemble: rebuild profile.json from a run directory's raw artifacts alone (no GPU, no workload)."""

from __future__ import annotations

import json
from pathlib import Path

from mcp_server.errors import ProfileFormatError
from mcp_server.pipeline.aggregate import window_totals
from mcp_server.pipeline.attribute import attribute_stream
from mcp_server.pipeline.provenance import load_provenance
from mcp_server.pipeline.rundir import PROFILE, read_manifest
from mcp_server.schema.io import write_model_streaming
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import (
    AggregatedMetrics,
    CaptureMetadata,
    Clocks,
    OperatorAttributedProfile,
    OperatorRecord,
)
from mcp_server.schema.records import CpuOp
from plugins.tools import gc_paused
from plugins.torch_profiler.reader import read_kineto_trace

CPU_ONLY_NOTE = "No GPU was used: CUDA was not available to the workload, so this profile holds CPU operator times."


def _harness(run_dir: Path, pass_name: str) -> dict:
    path = run_dir / pass_name / "harness.json"
    if not path.is_file():
        raise ProfileFormatError(f"missing {path}", "the run directory is incomplete; re-run the capture")
    return json.loads(path.read_text(encoding="utf-8"))


def capture_metadata(manifest: RunManifest, harness: dict, tool: str) -> CaptureMetadata:
    """Capture metadata from the manifest (what was asked) and the harness (what the child saw)."""
    env = harness.get("environment", {})
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
        finished_at=harness.get("finished_at", manifest.created_at), clocks=clocks,
        tool_versions=manifest.tool_versions, notes=[] if gpu_used else [CPU_ONLY_NOTE],
    )


def _cpu_operators(cpu_ops: list[CpuOp]) -> list[OperatorRecord]:
    seen: dict[str, int] = {}
    operators = []
    for op in cpu_ops:
        index = seen.get(op.name, 0)
        seen[op.name] = index + 1
        modules = [f.name for f in op.stack if f.kind == "module"]
        operators.append(
            OperatorRecord(
                operator_id=f"{op.name}#{index}", operator_name=op.name, call_index=index,
                module_path=modules[-1] if modules else None,
                input_shapes=op.input_shapes, input_dtypes=op.input_dtypes,
                aggregated=AggregatedMetrics(cpu_self_time_ns=op.self_ns, cpu_total_time_ns=op.duration_ns),
            )
        )
    return operators


def assemble_torch(run_dir: Path, manifest: RunManifest) -> OperatorAttributedProfile:
    """Profile from the torch.profiler pass: kernels joined to aten ops by External id."""
    harness = _harness(run_dir, "torch")
    capture = read_kineto_trace(run_dir / "torch" / "kineto_trace.json")
    meta = capture_metadata(manifest, harness, "torch_profiler")
    wall = harness.get("window", {}).get("wall_time_ns", 0)
    warnings = list(harness.get("warnings", [])) + capture.warnings
    if not meta.gpu_used:
        operators = _cpu_operators(capture.cpu_ops)
        window = window_totals(operators, [], wall)
        window.cpu_operator_time_ns = sum(op.duration_ns for op in capture.cpu_ops)
        return OperatorAttributedProfile(capture_metadata=meta, window=window, operators=operators, warnings=warnings)
    origins = load_provenance(run_dir / "torch")
    start = capture.window_start_ns or min((k.start_ns for k in capture.kernels), default=0)
    operators, unattributed = attribute_stream(capture.kernels, origins, start)
    if unattributed:
        warnings.append(f"{len(unattributed)} kernels could not be attributed (kept in unattributed_kernels)")
    if not capture.kernels:
        warnings.append("CUDA was available but the window launched no kernel")
    window = window_totals(operators, unattributed, wall)
    window.gpu_elapsed_ns = harness.get("window", {}).get("gpu_elapsed_ns")
    return OperatorAttributedProfile(
        capture_metadata=meta, window=window, operators=operators, unattributed_kernels=unattributed, warnings=warnings
    )


def assemble(run_dir: Path) -> OperatorAttributedProfile:
    """Rebuild the profile of a run directory from its manifest and raw artifacts."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    names = {p.name for p in manifest.passes}
    with gc_paused():
        if "nsys" in names:
            from mcp_server.pipeline.assemble_nsys import assemble_nsys

            return assemble_nsys(run_dir, manifest)
        if "torch" in names:
            return assemble_torch(run_dir, manifest)
    raise ProfileFormatError(f"{run_dir} holds no capture pass", "re-run `operator-profiler profile`")


def write_profile(run_dir: Path, profile: OperatorAttributedProfile, name: str = PROFILE) -> Path:
    """Atomically write profile.json into the run directory (operator by operator: a profile may hold millions)."""
    path = Path(run_dir) / name
    with gc_paused():
        write_model_streaming(path, profile, ("operators", "unattributed_kernels"))
    return path


