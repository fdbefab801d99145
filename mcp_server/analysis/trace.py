"""Chrome/Perfetto trace of the window (Trace Event Format, JSON object form).

One process "GPU"; one track per CUDA stream with the kernels (complete events, `ph: X`, microseconds),
named by kernel and carrying operator, module, class and key counters in `args`; one "operators" track with a
span per operator call (first kernel start to last kernel end, GPU time); one "idle gaps" track with the
window's idle stretches and their likely cause. Loads in ui.perfetto.dev and chrome://tracing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp_server.analysis.timeline_health import Placed, idle_gaps
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import write_json_atomic

GPU_PID = 1
OPERATOR_TID = 1_000_000
GAP_TID = 1_000_001


def _meta(name: str, pid: int, tid: int | None, value: str) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": {"name": value}}
    if tid is not None:
        event["tid"] = tid
    return event


def build_trace(analysis: Analysis, placed: list[Placed]) -> dict[str, Any]:
    """The trace as a dict: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}."""
    by_kernel = {k.kernel_id: k for k in analysis.kernels}
    events: list[dict[str, Any]] = [_meta("process_name", GPU_PID, None, f"GPU: {analysis.configuration.device}")]
    streams = sorted({p.kernel.stream_id if p.kernel.stream_id is not None else -1 for p in placed})
    for sid in streams:
        events.append(_meta("thread_name", GPU_PID, sid, f"stream {sid}" if sid >= 0 else "stream (unknown)"))
    events.append(_meta("thread_name", GPU_PID, OPERATOR_TID, "operators"))
    events.append(_meta("thread_name", GPU_PID, GAP_TID, "idle gaps"))
    spans: dict[str, list[int]] = {}
    for p in placed:
        kernel, ka = p.kernel, by_kernel.get(p.kernel.kernel_id)
        args: dict[str, Any] = {
            "operator": p.op.operator_id if p.op else None, "module": kernel.module_path or (p.op.module_path if p.op
                                                                                               else None),
            "kernel_id": kernel.kernel_id, "duration_ns": kernel.duration_ns, "gap_before_ns": p.gap_before_ns,
            "attribution": kernel.attribution.method.value, "launch_op": kernel.attribution.launch_op,
        }
        if ka is not None:
            args["bottleneck"] = ka.bottleneck.value
            args["reasons"] = ka.reasons
            if ka.roofline is not None and ka.roofline.pct_of_roof is not None:
                args["pct_of_roof"] = round(ka.roofline.pct_of_roof, 2)
            if ka.stalls is not None:
                args["dominant_stall"] = ka.stalls.dominant
        events.append({
            "name": kernel.kernel_name, "cat": "kernel", "ph": "X", "ts": kernel.start_ns / 1e3,
            "dur": kernel.duration_ns / 1e3, "pid": GPU_PID,
            "tid": kernel.stream_id if kernel.stream_id is not None else -1, "args": args,
        })
        if p.op is not None:
            span = spans.setdefault(p.op.operator_id, [kernel.start_ns, p.end_ns])
            span[0], span[1] = min(span[0], kernel.start_ns), max(span[1], p.end_ns)
    operators = {o.operator_id: o for o in analysis.operators}
    for op_id, (start, end) in spans.items():
        op = operators.get(op_id)
        events.append({
            "name": op.operator_name if op else op_id, "cat": "operator", "ph": "X", "ts": start / 1e3,
            "dur": (end - start) / 1e3, "pid": GPU_PID, "tid": OPERATOR_TID,
            "args": {"operator_id": op_id, "module": op.module_path if op else None,
                     "kernels": op.kernel_count if op else None,
                     "bottleneck": op.bottleneck.value if op else None},
        })
    if analysis.timeline is not None:
        for gap in idle_gaps(placed, analysis.timeline.window_ns):
            events.append({"name": f"idle: {gap.cause}", "cat": "gap", "ph": "X", "ts": gap.start_ns / 1e3,
                           "dur": gap.duration_ns / 1e3, "pid": GPU_PID, "tid": GAP_TID,
                           "args": {"duration_ns": gap.duration_ns, "cause": gap.cause}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"tool": "operator-profiler analyze", "time_unit_of_ts_and_dur": "us",
                          "note": "timestamps relative to the start of the measured window"}}


def write_trace(analysis: Analysis, placed: list[Placed], path: Path) -> Path:
    """Write the trace atomically."""
    write_json_atomic(Path(path), build_trace(analysis, placed))
    return Path(path)
