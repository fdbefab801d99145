"""Aggregation: roll each operator's kernels up into the seed's `aggregated` block, and window totals."""

from __future__ import annotations

from mcp_server.schema.profile import (
    AggregatedMetrics,
    AttributionMethod,
    Confidence,
    KernelRecord,
    OperatorRecord,
    WindowTotals,
)

# Duration-weighted averages: aggregated field -> kernel metric key (metrics.yaml).
_WEIGHTED = {
    "achieved_occupancy_pct": "achieved_occupancy_pct",
    "tensor_core_active_pct": "tensor_pipe_active_pct",
    "l1_hit_rate_pct": "l1_hit_rate_pct",
    "l2_hit_rate_pct": "l2_hit_rate_pct",
    "sm_throughput_pct": "sm_throughput_pct",
    "dram_throughput_pct": "dram_throughput_pct",
}
# FLOPs per precision: tensor-path ops counted as reported; CUDA-core FMA instructions count 2.
_FLOPS = {
    "fp32": {"inst_fadd": 1, "inst_fmul": 1, "inst_ffma": 2},
    "fp64": {"inst_dadd": 1, "inst_dmul": 1, "inst_dfma": 2},
    "fp16": {"inst_hadd": 1, "inst_hmul": 1, "inst_hfma": 2},
    "tensor_bf16": {"flop_tensor_bf16": 1},
    "tensor_fp16": {"flop_tensor_fp16": 1},
    "tensor_tf32": {"flop_tensor_tf32": 1},
    "tensor_fp8": {"flop_tensor_fp8": 1},
    "tensor_fp64": {"flop_tensor_fp64": 1},
}


def kernel_flops(kernel: KernelRecord) -> dict[str, float]:
    """FLOPs by precision from one kernel's counters (empty without counters)."""
    flops: dict[str, float] = {}
    for precision, parts in _FLOPS.items():
        present = [kernel.metrics[k].value * w for k, w in parts.items() if k in kernel.metrics]
        if present:
            flops[precision] = float(sum(present))
    return flops


def aggregate(kernels: list[KernelRecord]) -> AggregatedMetrics:
    """The aggregated block of one operator call."""
    agg = AggregatedMetrics(kernel_count=len(kernels), total_duration_ns=sum(k.duration_ns for k in kernels))
    if not kernels:
        return agg
    agg.dominant_kernel = max(kernels, key=lambda k: k.duration_ns).kernel_name
    with_counters = [k for k in kernels if k.metrics]
    if not with_counters:
        return agg
    for field, key in (("dram_bytes_read", "dram_bytes_read"), ("dram_bytes_written", "dram_bytes_write")):
        values = [k.metrics[key].value for k in with_counters if key in k.metrics]
        if values:
            setattr(agg, field, float(sum(values)))
    for field, key in _WEIGHTED.items():
        pairs = [(k.metrics[key].value, max(k.duration_ns, 1)) for k in with_counters if key in k.metrics]
        if pairs:
            setattr(agg, field, sum(v * w for v, w in pairs) / sum(w for _, w in pairs))
    totals: dict[str, float] = {}
    for kernel in with_counters:
        for precision, value in kernel_flops(kernel).items():
            totals[precision] = totals.get(precision, 0.0) + value
    agg.flops_by_precision = {p: v for p, v in totals.items() if v > 0}
    moved = (agg.dram_bytes_read or 0.0) + (agg.dram_bytes_written or 0.0)
    if agg.flops_by_precision and moved > 0:
        agg.arithmetic_intensity_flop_per_byte = sum(agg.flops_by_precision.values()) / moved
    return agg


def busy_time_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def window_totals(operators: list[OperatorRecord], unattributed: list[KernelRecord], wall_time_ns: int) -> WindowTotals:
    """Totals over the window: kernel time, GPU busy time, attributed and high-confidence shares."""
    kernels = [k for op in operators for k in op.kernels] + unattributed
    kernel_time = sum(k.duration_ns for k in kernels)
    attributed = sum(k.duration_ns for k in kernels if k.attribution.method != AttributionMethod.UNATTRIBUTED)
    high = sum(k.duration_ns for k in kernels if k.attribution.confidence == Confidence.HIGH)
    return WindowTotals(
        wall_time_ns=wall_time_ns,
        gpu_busy_time_ns=busy_time_ns([(k.start_ns, k.start_ns + k.duration_ns) for k in kernels]) if kernels else None,
        kernel_count=len(kernels),
        kernel_time_ns=kernel_time,
        attributed_kernel_time_pct=100.0 * attributed / kernel_time if kernel_time else None,
        high_confidence_kernel_time_pct=100.0 * high / kernel_time if kernel_time else None,
        operator_count=len(operators),
    )
