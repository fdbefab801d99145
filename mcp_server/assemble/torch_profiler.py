"""Assemble the torch.profiler backend: kernels joined to aten ops by External id, or CPU operator times."""

from __future__ import annotations

import statistics

from mcp_server.assemble.aggregate import module_coverage_warning, window_totals
from mcp_server.assemble.attribute import Context, attribute_stream, work_of
from mcp_server.assemble.events import (
    OperatorKeys,
    attribute_events,
    ddp_timed,
    event_warnings,
    sites_from_graph_breaks,
)
from mcp_server.assemble.metadata import capture_metadata, harness_result
from mcp_server.assemble.phases import settle_phases
from mcp_server.assemble.provenance import GRAPH_CALL_PREFIX, Provenance, load_provenance
from mcp_server.assemble.threads import OtherThreads
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.profile import AggregatedMetrics, OperatorAttributedProfile, OperatorRecord, WindowTotals
from mcp_server.schema.records import CpuOp, Frame
from plugins.torch_profiler.reader import read_kineto_trace

GENERATED_CPU_KERNEL = "cpp_fused_"
MIN_OPERATOR_TIME_PCT = 25.0  # a CPU window whose operators take less of it runs mostly outside them
MIN_OUTSIDE_NS = 5_000_000  # ... and only when that leaves this much outside (a tiny window is mostly overhead)


def window_outside_operators(window: WindowTotals) -> tuple[int, float] | None:
    """A CPU-only window that runs mostly outside its outermost torch operators: (the window's length, the share
    its operators take, 0-100), else None. The window is the fastest of those timed without the profiler when the
    run has them (neither the profiler's overhead nor a window another process slowed down is counted against the
    operators), else the profiled one."""
    fastest = window.unprofiled_wall_time_range_ns[0] if window.unprofiled_wall_time_range_ns else None
    whole = fastest or window.unprofiled_wall_time_ns or window.wall_time_ns
    if not whole or window.cpu_operator_time_ns is None:
        return None
    inside = min(100.0, 100.0 * window.cpu_operator_time_ns / whole)
    if inside >= MIN_OPERATOR_TIME_PCT or whole - window.cpu_operator_time_ns < MIN_OUTSIDE_NS:
        return None
    return whole, inside


def outside_operators(window: WindowTotals) -> list[str]:
    """The warning for a CPU-only window that runs mostly outside torch operators (Python code, other processes,
    waiting): its operators' shares are shares of operator time, not of the window."""
    found = window_outside_operators(window)
    if found is None:
        return []
    whole, inside = found
    which = ""
    if window.unprofiled_wall_time_range_ns and window.unprofiled_wall_time_ns:
        which = (f" (the fastest of {window.unprofiled_windows} windows without the profiler; median "
                 f"{window.unprofiled_wall_time_ns / 1e6:.1f} ms)")
    elif window.unprofiled_wall_time_ns:
        which = " (median without the profiler)"
    return [f"the window lasted {whole / 1e6:.1f} ms{which} but its torch operators took "
            f"{(window.cpu_operator_time_ns or 0) / 1e6:.1f} ms ({inside:.1f} %): most of the window runs outside "
            "operators (Python code, other processes, waiting), which no operator table shows; the operators' "
            "shares are shares of operator time, not of the window"]


def _cpu_operators(
    cpu_ops: list[CpuOp], provenance: Provenance, context: Context, window_start_ns: int | None = None
) -> list[OperatorRecord]:
    """One record per outermost operator call; a kernel Inductor generated is one too, with the aten ops it
    fused (from its provenance when known, else from its name)."""
    seen: dict[str, int] = {}
    operators = []
    placed = _extern_modules(cpu_ops, provenance)
    for position, op in enumerate(cpu_ops):
        index = seen.get(op.name, 0)
        seen[op.name] = index + 1
        work = work_of([*op.stack, Frame(name=op.name, kind="op", start_ns=op.start_ns, seq=op.seq)], context,
                       op.thread)
        origin = provenance.kernels.get(op.name)
        fused = op.name.startswith(GENERATED_CPU_KERNEL)
        module_path = work.module_path or (origin.module_path if origin else placed.get(position))
        operators.append(
            OperatorRecord(
                operator_id=f"{op.name}#{index}", operator_name=op.name, call_index=index, module_path=module_path,
                input_shapes=op.input_shapes, input_dtypes=op.input_dtypes, is_fused=fused,
                fused_operators=(origin.aten_ops if origin and origin.aten_ops else _fused_from_name(op.name))
                if fused else [],
                aggregated=AggregatedMetrics(cpu_self_time_ns=op.self_ns, cpu_total_time_ns=op.duration_ns,
                                             cpu_self_time_by_operator_ns=dict(op.nested_self_ns)),
                phase=work.phase, call_site=work.call_site or (origin.call_site if origin else None),
                autograd_node=work.autograd_node, forward_op=work.forward_op, recomputed=work.recomputed,
                host_start_ns=op.start_ns - window_start_ns if window_start_ns is not None else None,
            )
        )
    settle_phases(operators)
    return operators


def _extern_modules(cpu_ops: list[CpuOp], provenance: Provenance) -> dict[int, str | None]:
    """Module paths of the aten ops a compiled graph called (its extern calls), by position in `cpu_ops`: the
    calls of one graph invocation are those of a generated module when their names follow the same order."""
    groups: dict[tuple[int | None, int | None], list[int]] = {}
    for position, op in enumerate(cpu_ops):
        graph = next((f for f in op.stack if f.name.startswith(GRAPH_CALL_PREFIX)), None)
        if graph is not None and not op.name.startswith(GENERATED_CPU_KERNEL):
            groups.setdefault((op.thread, graph.start_ns), []).append(position)
    placed: dict[int, str | None] = {}
    for positions in groups.values():
        names = [cpu_ops[p].name for p in positions]
        for calls in provenance.extern_calls:
            externs = [c for c in calls if c.kind == "extern"]
            if [c.operator_name for c in externs] == names:
                placed.update(zip(positions, (c.module_path for c in externs), strict=True))
                break
    return placed


def _fused_from_name(kernel: str) -> list[str]:
    """The aten ops a generated kernel's name lists (`cpp_fused_convolution_relu_1` -> convolution, relu):
    Inductor names a fused kernel after its ops."""
    ops = kernel.removeprefix(GENERATED_CPU_KERNEL).rsplit("_", 1)[0]
    known = ("_native_batch_norm_legit_no_training", "max_pool2d_with_indices", "leaky_relu", "native_layer_norm")
    found = [name for name in known if name in ops]
    for name in found:
        ops = ops.replace(name, "")
    found += [part for part in ops.split("_") if part]
    return sorted(f"aten::{name}" for name in found)


def assemble_torch(run_dir: RunDir, manifest: RunManifest) -> OperatorAttributedProfile:
    """Profile from the torch.profiler pass: kernels joined to aten ops by External id."""
    harness = harness_result(run_dir, "torch")
    capture = read_kineto_trace(run_dir.kineto_trace())
    meta = capture_metadata(manifest, harness, "torch_profiler")
    meta.window_clock_start_ns = capture.window_start_ns
    wall = harness.the_window.wall_time_ns
    warnings = list(harness.warnings) + capture.warnings
    origins = load_provenance(run_dir.provenance("torch"))
    context = Context(capture.sequences, capture.forward_threads, harness.root_module or origins.root_module)
    if not meta.gpu_used:
        operators = _cpu_operators(capture.cpu_ops, origins, context, capture.window_start_ns)
        unplaced = sum(1 for op in operators if op.module_path is None)
        if manifest.compile_mode != "eager" and unplaced:
            warnings.append(
                f"{unplaced} of {len(operators)} operator calls have no module path: on the CPU, a compiled graph's "
                "operators (Inductor's generated C++ kernels, or another backend's) name neither the FX nodes nor "
                "the modules they came from"
            )
        window = window_totals(operators, [], wall)
        window.cpu_operator_time_ns = sum(op.duration_ns for op in capture.cpu_ops)
        spread = [w.wall_time_ns for w in harness.unprofiled_windows or [] if w.wall_time_ns]
        if spread:  # the same window timed without the profiler, on the host clock
            window.unprofiled_wall_time_ns = int(statistics.median(spread))
            window.unprofiled_windows = len(spread)
            window.unprofiled_wall_time_range_ns = [min(spread), max(spread)]
        warnings += outside_operators(window)
        return OperatorAttributedProfile(capture_metadata=meta, window=window, operators=operators, warnings=warnings)
    start = capture.window_start_ns or min((k.start_ns for k in capture.kernels), default=0)
    operator_ids: OperatorKeys = {}
    others = OtherThreads(capture.forward_threads)
    operators, unattributed = attribute_stream(others.watch(capture.kernels), origins, start, context=context,
                                               operator_keys=operator_ids)
    events = attribute_events(capture.runtime_calls, start, context, operator_ids,
                              [k for op in operators for k in op.kernels] + unattributed, ddp_timed(harness))
    settle_phases(operators, events)
    sites_from_graph_breaks(events, meta.graph_breaks)
    warnings += event_warnings(events)
    if unattributed:
        warnings.append(f"{len(unattributed)} kernels could not be attributed (kept in unattributed_kernels)")
        warnings += others.warnings(unattributed)
    if not capture.kernels:
        warnings.append("CUDA was available but the window launched no kernel")
    window = window_totals(operators, unattributed, wall)
    window.gpu_elapsed_ns = harness.the_window.gpu_elapsed_ns
    warnings += module_coverage_warning(operators, window)
    return OperatorAttributedProfile(
        capture_metadata=meta, window=window, operators=operators, unattributed_kernels=unattributed,
        runtime_events=events, warnings=warnings,
    )
