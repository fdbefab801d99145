"""Aggregation: roll each operator's kernels up into the seed's `aggregated` block, and window totals."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from mcp_server.schema.profile import (
    AggregatedMetrics,
    AttributionMethod,
    Confidence,
    HostOperatorTime,
    KernelRecord,
    OperatorRecord,
    WindowTotals,
)
from plugins.nsys.host_compute import HostCall

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


_set = object.__setattr__


def finish_record(model: BaseModel, fields_set: set[str]) -> None:
    """What pydantic keeps beside the fields of a record built field by field, without validation.

    The fields were set one at a time (not as a whole `__dict__`, as `model_construct` does): the instances of a
    class then share their dict's keys, a third of a plain dict's size, which matters for a million records.
    """
    _set(model, "__pydantic_fields_set__", fields_set)
    _set(model, "__pydantic_extra__", None)
    _set(model, "__pydantic_private__", None)


_COUNTED = frozenset({"kernel_count", "total_duration_ns", "dominant_kernel"})
_AGGREGATED_FIELDS = (
    "total_duration_ns", "kernel_count", "dominant_kernel", "dram_bytes_read", "dram_bytes_written",
    "achieved_occupancy_pct", "tensor_core_active_pct", "l1_hit_rate_pct", "l2_hit_rate_pct", "sm_throughput_pct",
    "dram_throughput_pct", "flops_by_precision", "arithmetic_intensity_flop_per_byte", "cpu_self_time_ns",
    "cpu_total_time_ns", "cpu_self_time_by_operator_ns",
)
if tuple(AggregatedMetrics.model_fields) != _AGGREGATED_FIELDS:  # a schema change must reach _counted_only
    raise ImportError("AggregatedMetrics fields changed: update _counted_only")


def _counted_only(total: int, count: int, dominant: str, fields_set: set[str]) -> AggregatedMetrics:
    """AggregatedMetrics(kernel_count=count, total_duration_ns=total) with `dominant_kernel` set, and nothing else."""
    agg = AggregatedMetrics.__new__(AggregatedMetrics)
    _set(agg, "total_duration_ns", total)
    _set(agg, "kernel_count", count)
    _set(agg, "dominant_kernel", dominant)
    for name in _AGGREGATED_FIELDS[3:11]:
        _set(agg, name, None)
    _set(agg, "flops_by_precision", {})
    _set(agg, "arithmetic_intensity_flop_per_byte", None)
    _set(agg, "cpu_self_time_ns", None)
    _set(agg, "cpu_total_time_ns", None)
    _set(agg, "cpu_self_time_by_operator_ns", None)
    finish_record(agg, fields_set)
    return agg


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
    return aggregate_into(kernels, None)


def aggregate_into(kernels: list[KernelRecord], counted: set[str] | None) -> AggregatedMetrics:
    """`aggregate(kernels)`, sharing `counted` (from `counted_fields()`) as the fields-set of every block without
    counters: kernel count, time and dominant kernel only, the usual block (None: a set of its own)."""
    total = 0
    dominant: KernelRecord | None = None
    with_counters = False
    for kernel in kernels:
        duration = kernel.duration_ns
        total += duration
        if dominant is None or duration > dominant.duration_ns:
            dominant = kernel
        with_counters = with_counters or bool(kernel.metrics)
    if dominant is None or with_counters:
        return _aggregate_counters(kernels, total, dominant)
    return _counted_only(total, len(kernels), dominant.kernel_name, set(_COUNTED) if counted is None else counted)


def counted_fields() -> set[str]:
    """The fields-set of an aggregated block with no counters, for `aggregate_into`."""
    return set(_COUNTED)


def _aggregate_counters(kernels: list[KernelRecord], total: int, dominant: KernelRecord | None) -> AggregatedMetrics:
    """The aggregated block of a call without kernels, or with counters on some of them."""
    agg = AggregatedMetrics(kernel_count=len(kernels), total_duration_ns=total)
    if dominant is None:
        return agg
    agg.dominant_kernel = dominant.kernel_name
    with_counters = [k for k in kernels if k.metrics]
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


def _union_ns(starts: list[int], ends: list[int]) -> int:
    """busy_time_ns of the intervals [starts[i], ends[i]), none of them reversed, from the two sorted bounds."""
    starts.sort()
    ends.sort()
    total = active = i = 0
    opened = 0
    count = len(starts)
    for end in ends:
        while i < count and starts[i] <= end:
            if active == 0:
                opened = starts[i]
            active += 1
            i += 1
        active -= 1
        if active == 0:
            total += end - opened
    return total


def window_totals(operators: list[OperatorRecord], unattributed: list[KernelRecord], wall_time_ns: int) -> WindowTotals:
    """Totals over the window: kernel time, GPU busy time, attributed and high-confidence shares."""
    kernel_time = attributed = high = with_module = with_site = 0
    by_phase: dict[str, int] = {}
    starts: list[int] = []
    ends: list[int] = []
    reversed_interval = False
    sets = [(op.kernels, op.module_path, op.call_site) for op in operators] + [(unattributed, None, None)]
    for kernels, module, site in sets:
        for k in kernels:
            duration, attribution = k.duration_ns, k.attribution
            kernel_time += duration
            if module:
                with_module += duration
            if site:
                with_site += duration
            if k.phase is not None:
                by_phase[k.phase] = by_phase.get(k.phase, 0) + duration
            if attribution.method != AttributionMethod.UNATTRIBUTED:
                attributed += duration
            if attribution.confidence == Confidence.HIGH:
                high += duration
            starts.append(k.start_ns)
            ends.append(k.start_ns + duration)
            reversed_interval = reversed_interval or duration < 0
    if not starts:
        busy = None
    elif reversed_interval:
        busy = busy_time_ns(list(zip(starts, ends, strict=True)))
    else:
        busy = _union_ns(starts, ends)
    return WindowTotals(
        wall_time_ns=wall_time_ns,
        gpu_busy_time_ns=busy,
        kernel_count=len(starts),
        kernel_time_ns=kernel_time,
        attributed_kernel_time_pct=100.0 * attributed / kernel_time if kernel_time else None,
        high_confidence_kernel_time_pct=100.0 * high / kernel_time if kernel_time else None,
        module_path_kernel_time_pct=100.0 * with_module / kernel_time if kernel_time else None,
        call_site_kernel_time_pct=100.0 * with_site / kernel_time if kernel_time else None,
        kernel_time_by_phase_ns=by_phase or None,
        operator_count=len(operators),
    )


MODULE_COVERAGE_WARN_PCT = 95.0  # below this share of kernel time with a module path, the profile says so


def module_coverage_warning(operators: list[OperatorRecord], window: WindowTotals) -> list[str]:
    """A warning when module paths cover less than MODULE_COVERAGE_WARN_PCT % of the window's kernel time, naming
    the operators that carry most of the rest."""
    pct = window.module_path_kernel_time_pct
    if pct is None or pct >= MODULE_COVERAGE_WARN_PCT:
        return []
    missing: dict[str, int] = {}
    for op in operators:
        if not op.module_path:
            missing[op.operator_name] = missing.get(op.operator_name, 0) + sum(k.duration_ns for k in op.kernels)
    top = ", ".join(name for name, _ in sorted(missing.items(), key=lambda item: -item[1])[:3])
    return [f"module paths cover {pct:.1f} % of the window's kernel time (below {MODULE_COVERAGE_WARN_PCT:.0f} %): "
            f"module-level numbers leave out the rest{f', led by {top}' if top else ''} (ops called outside the "
            "model, and backward work whose forward op could not be found, have no module path)"]


def counter_coverage(window: WindowTotals, kernels: list[KernelRecord]) -> None:
    """The shares of kernel time whose counters ncu measured on the launch itself, copied from another launch of its
    configuration (and, of those, from the nearest measured shape), and none."""
    total = sum(k.duration_ns for k in kernels)
    if not total:
        return
    measured = sum(k.duration_ns for k in kernels if k.metrics and k.propagated_from is None)
    copied = sum(k.duration_ns for k in kernels if k.metrics and k.propagated_from is not None)
    nearest = sum(k.duration_ns for k in kernels if k.metrics and k.propagation == "nearest_shape")
    window.measured_counter_kernel_time_pct = round(100.0 * measured / total, 3)
    window.propagated_counter_kernel_time_pct = round(100.0 * copied / total, 3)
    window.nearest_shape_kernel_time_pct = round(100.0 * nearest / total, 3)
    window.no_counter_kernel_time_pct = round(100.0 * (total - measured - copied) / total, 3)


HOST_OPERATORS_KEPT = 10


def host_compute(calls: Sequence[HostCall]) -> tuple[int, list[HostOperatorTime]]:
    """The host's own compute (`plugins.nsys.host_compute`): its total time, and the largest by operator, module
    and call site."""
    groups: dict[tuple[str, str | None, str | None], list[int]] = {}
    for call in calls:
        groups.setdefault((call.name, call.module_path, call.call_site), []).append(call.duration_ns)
    ranked = sorted(groups.items(), key=lambda item: -sum(item[1]))[:HOST_OPERATORS_KEPT]
    return sum(c.duration_ns for c in calls), [
        HostOperatorTime(operator_name=name, module_path=module, call_site=site, calls=len(times),
                         host_time_ns=sum(times)) for (name, module, site), times in ranked]
