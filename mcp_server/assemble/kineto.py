"""Assemble the torch.profiler backend: kernels joined to aten ops by External id, or CPU operator times."""

from __future__ import annotations

from mcp_server.assemble.aggregate import window_totals
from mcp_server.assemble.attribute import attribute_stream
from mcp_server.assemble.metadata import capture_metadata, harness_result
from mcp_server.assemble.provenance import load_provenance
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import AggregatedMetrics, OperatorAttributedProfile, OperatorRecord
from mcp_server.schema.records import CpuOp
from plugins.torch_profiler.reader import read_kineto_trace


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


def assemble_torch(run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
    """Profile from the torch.profiler pass: kernels joined to aten ops by External id."""
    harness = harness_result(run_dir, "torch")
    capture = read_kineto_trace(run_dir.kineto_trace())
    meta = capture_metadata(manifest, harness, "torch_profiler")
    wall = harness.get("window", {}).get("wall_time_ns", 0)
    warnings = list(harness.get("warnings", [])) + capture.warnings
    if not meta.gpu_used:
        operators = _cpu_operators(capture.cpu_ops)
        window = window_totals(operators, [], wall)
        window.cpu_operator_time_ns = sum(op.duration_ns for op in capture.cpu_ops)
        return OperatorAttributedProfile(capture_metadata=meta, window=window, operators=operators, warnings=warnings)
    origins = load_provenance(run_dir.provenance("torch"))
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
