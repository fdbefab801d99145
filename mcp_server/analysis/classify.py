"""Bottleneck classes per kernel: memory, compute, latency or launch overhead, from bottleneck_rules.yaml.

Order of the rules (thresholds in knowledge/bottleneck_rules.yaml):
1. launch overhead: a tiny kernel (< launch.tiny_kernel_ns) whose preceding GPU idle gap is at least
   launch.launch_bound_gap_ratio x its duration: it waited on the host longer than it ran;
2. without counters nothing more can be said (unknown);
3. Nsight Compute speed of light: the larger of SM and memory throughput at or above
   speed_of_light.well_utilised_pct makes the kernel compute- or memory-bound (the larger side wins; within
   balanced_diff_pct it is named balanced);
4. otherwise latency-bound, with the reasons found: grid under one wave, low occupancy, a flagged stall.
"""

from __future__ import annotations

from mcp_server.analysis.rules import rule
from mcp_server.analysis.stalls import stall_name
from mcp_server.assemble.collectives import kernel_collective
from mcp_server.schema.analysis import Bottleneck, KernelAnalysis, StallBreakdown
from mcp_server.schema.profile import KernelRecord


def _value(kernel: KernelRecord, key: str) -> float | None:
    metric = kernel.metrics.get(key)
    return metric.value if metric is not None else None


def classify_kernel(
    kernel: KernelRecord, gap_before_ns: int | None, stalls: StallBreakdown | None = None
) -> tuple[Bottleneck, list[str]]:
    """The kernel's bottleneck class and the `metric=value` triggers behind it."""
    tiny = kernel.duration_ns < rule("launch", "tiny_kernel_ns")
    waited = gap_before_ns is not None and gap_before_ns >= rule("launch", "launch_bound_gap_ratio") * max(
        kernel.duration_ns, 1
    )
    if tiny and waited:
        return Bottleneck.LAUNCH_OVERHEAD, [f"duration_ns={kernel.duration_ns}", f"gap_before_ns={gap_before_ns}"]
    sm, mem = _value(kernel, "sm_throughput_pct"), _value(kernel, "memory_throughput_pct")
    if sm is None or mem is None:
        return Bottleneck.UNKNOWN, ["counters=none"]
    reasons = [f"sm_throughput_pct={sm:.1f}", f"memory_throughput_pct={mem:.1f}"]
    if max(sm, mem) >= rule("speed_of_light", "well_utilised_pct"):
        dram = _value(kernel, "dram_throughput_pct")
        if dram is not None:
            reasons.append(f"dram_throughput_pct={dram:.1f}")
        if abs(sm - mem) < rule("speed_of_light", "balanced_diff_pct"):
            reasons.append("balanced=compute_and_memory")
        return (Bottleneck.COMPUTE if sm > mem else Bottleneck.MEMORY), reasons
    waves = _value(kernel, "waves_per_sm")
    if waves is not None and waves < rule("speed_of_light", "small_grid_waves"):
        reasons.append(f"waves_per_sm={waves:.3f}")
    occupancy = _value(kernel, "achieved_occupancy_pct")
    if occupancy is not None and occupancy < rule("occupancy", "low_achieved_pct"):
        reasons.append(f"achieved_occupancy_pct={occupancy:.1f}")
    if stalls is not None and stalls.flagged and stalls.dominant:
        reasons.append(f"{stalls.dominant}_share_pct={stalls.dominant_share_pct:.0f}")
    return Bottleneck.LATENCY, reasons


def key_issue(kernel: KernelRecord, bottleneck: Bottleneck, gap_before_ns: int | None,
              stalls: StallBreakdown | None, sm_count: int | None) -> str:
    """One short phrase naming what most limits the kernel."""
    if bottleneck == Bottleneck.LAUNCH_OVERHEAD:
        return f"host gap {(gap_before_ns or 0) / 1e3:.1f} us > run {kernel.duration_ns / 1e3:.1f} us"
    if bottleneck == Bottleneck.UNKNOWN:
        collective = kernel_collective(kernel.kernel_name)
        return f"NCCL {collective}: communication, not replayed" if collective else "no counters"
    spills = sum(_value(kernel, k) or 0.0 for k in ("local_spill_bytes_ld", "local_spill_bytes_st"))
    if spills >= rule("memory", "spill_bytes_min"):
        return f"register spills: {spills:.0f} bytes of local memory traffic"
    if bottleneck == Bottleneck.MEMORY:
        dram, l2 = _value(kernel, "dram_throughput_pct"), _value(kernel, "l2_hit_rate_pct")
        if l2 is not None and l2 < rule("memory", "l2_hit_low_pct"):
            return f"memory-bound, L2 hit {l2:.0f} %"
        mem = _value(kernel, "memory_throughput_pct") or 0.0
        if dram is not None and mem - dram >= rule("speed_of_light", "balanced_diff_pct"):
            return f"memory-bound on chip (L1/shared/L2 {mem:.0f} % of peak, DRAM {dram:.0f} %)"
        return f"memory-bound, DRAM {dram or 0:.0f} % of peak"
    if bottleneck == Bottleneck.COMPUTE:
        tensor = _value(kernel, "tensor_pipe_active_pct")
        return f"compute-bound, tensor pipe {tensor or 0:.0f} %"
    waves, grid = _value(kernel, "waves_per_sm"), _value(kernel, "grid_size")
    if waves is not None and waves < rule("speed_of_light", "small_grid_waves"):
        sms = f" on {sm_count} SMs" if sm_count else ""
        return f"{grid or 0:.0f} blocks = {waves:.2g} waves{sms}"
    if stalls is not None and stalls.flagged and stalls.dominant:
        return f"stalled on {stall_name(stalls.dominant)} ({stalls.dominant_share_pct:.0f} % of stalls)"
    occupancy = _value(kernel, "achieved_occupancy_pct")
    return f"latency-bound, occupancy {occupancy or 0:.0f} %"


def kernel_issue(k: KernelAnalysis) -> str | None:
    """The key_issue phrase recorded among a kernel's reasons."""
    return next((r.split("=", 1)[1] for r in k.reasons if r.startswith("key_issue=")), None)
