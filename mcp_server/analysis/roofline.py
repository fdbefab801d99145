"""Roofline per kernel and per operator, from ncu counts over ncu's own duration.

ncu replays each kernel at locked (base) clocks, while `duration_ns` comes from nsys/Kineto at real clocks:
rates computed from ncu counts therefore use the ncu `duration` metric (gpu__time_duration), and compute peaks
are rescaled to the SM clock of that replay (`sm_clock_hz` = elapsed SM cycles / duration). Achieved/peak is
then FLOPs over (per-clock peak x elapsed cycles), never above 100 % unless a counter is inconsistent, which is
flagged (and only then clamped).
"""

from __future__ import annotations

from mcp_server.analysis.devices import peak_at_clock, precision_key
from mcp_server.assemble.aggregate import kernel_flops
from mcp_server.schema.analysis import DeviceSpec, Roofline
from mcp_server.schema.profile import KernelRecord, Metric

_TIME_UNITS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
               "second": 1e9}
_BYTE_UNITS = {"byte": 1.0, "bytes": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}
_HZ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9, "cycle/second": 1.0, "cycle/nsecond": 1e9}


def _scaled(metric: Metric | None, units: dict[str, float]) -> float | None:
    if metric is None:
        return None
    factor = units.get(metric.unit.strip().lower())
    return metric.value * factor if factor is not None else None


def ncu_duration_ns(kernel: KernelRecord) -> float | None:
    """gpu__time_duration of the ncu replay, ns (None without it or with an unknown unit)."""
    return _scaled(kernel.metrics.get("duration"), _TIME_UNITS)


def dram_bytes(kernel: KernelRecord) -> float | None:
    """DRAM bytes read + written during the replay (None without counters)."""
    parts = [_scaled(kernel.metrics.get(k), _BYTE_UNITS) for k in ("dram_bytes_read", "dram_bytes_write")]
    present = [p for p in parts if p is not None]
    return sum(present) if present else None


def sm_clock_mhz(kernel: KernelRecord) -> float | None:
    """SM clock during the replay, MHz (elapsed SM cycles per second of gpu__time_duration)."""
    hz = _scaled(kernel.metrics.get("sm_clock_hz"), _HZ_UNITS)
    return hz / 1e6 if hz else None


def _clamp(pct: float | None) -> float | None:
    return None if pct is None else min(max(pct, 0.0), 100.0)


def roofline_from_counts(
    flop_by_precision: dict[str, float],
    dram: float | None,
    duration_ns: float | None,
    clock_mhz: float | None,
    device: DeviceSpec | None,
) -> Roofline:
    """Intensity, achieved rates and % of the applicable roof for counts over `duration_ns` at `clock_mhz`."""
    flops = {p: v for p, v in flop_by_precision.items() if v > 0}
    total = float(sum(flops.values()))
    roof = Roofline(flop=total, flop_by_precision=flops, dram_bytes=dram, ncu_duration_ns=duration_ns,
                    sm_clock_mhz=clock_mhz)
    if dram is not None and dram > 0 and total > 0:
        roof.arithmetic_intensity_flop_per_byte = total / dram
    if not duration_ns or duration_ns <= 0:
        return roof
    seconds = duration_ns / 1e9
    roof.achieved_flop_per_s = total / seconds
    roof.achieved_dram_bytes_per_s = dram / seconds if dram is not None else None
    if device is None:
        return roof
    artifacts: list[str] = []
    best: tuple[float, str, float] | None = None  # (% of peak, precision, peak FLOP/s at the clock)
    for counter_precision, value in flops.items():
        key = precision_key(counter_precision)
        if not key:
            continue
        peak = peak_at_clock(device, key, clock_mhz)
        if not peak:
            continue
        pct = 100.0 * value / seconds / peak
        if best is None or pct > best[0]:
            best = (pct, key, peak)
    bandwidth = device.dram_bandwidth_bytes_per_s
    if best is not None:
        roof.compute_pct_of_peak, roof.precision, best_peak = best
        if bandwidth:
            roof.ridge_flop_per_byte = best_peak / bandwidth
    if bandwidth and dram is not None:
        if dram < 0:
            artifacts.append(f"negative DRAM bytes ({dram:.0f} byte)")
        roof.dram_pct_of_peak = 100.0 * dram / seconds / bandwidth
    candidates = [v for v in (roof.compute_pct_of_peak, roof.dram_pct_of_peak) if v is not None]
    if candidates:
        # Attainable = min(peak, AI x bandwidth): left of the ridge the memory roof applies, right of it compute.
        memory_side = roof.dram_pct_of_peak is not None and (
            roof.compute_pct_of_peak is None or roof.dram_pct_of_peak >= roof.compute_pct_of_peak
        )
        roof.roof = "memory" if memory_side else "compute"
        roof.pct_of_roof = max(candidates)
    for name, rate_pct in (("compute", roof.compute_pct_of_peak), ("DRAM", roof.dram_pct_of_peak)):
        if rate_pct is not None and rate_pct > 100.0:
            artifacts.append(f"{name} rate at {rate_pct:.1f} % of peak")
    if artifacts:
        roof.artifact = "; ".join(artifacts) + ": a measurement artifact (counter or clock inconsistent), clamped"
        roof.compute_pct_of_peak = _clamp(roof.compute_pct_of_peak)
        roof.dram_pct_of_peak = _clamp(roof.dram_pct_of_peak)
        roof.pct_of_roof = _clamp(roof.pct_of_roof)
    return roof


def kernel_roofline(kernel: KernelRecord, device: DeviceSpec | None) -> Roofline | None:
    """Roofline of one kernel (None when it carries no counters)."""
    if not kernel.metrics:
        return None
    clock = sm_clock_mhz(kernel) or (device.base_clock_mhz if device else None)
    return roofline_from_counts(kernel_flops(kernel), dram_bytes(kernel), ncu_duration_ns(kernel), clock, device)


def combined_roofline(kernels: list[KernelRecord], device: DeviceSpec | None) -> Roofline | None:
    """Roofline of a group of kernels (an operator): summed counts over summed ncu durations.

    The clock is the duration-weighted mean of the kernels' replay clocks, so summed elapsed cycles are kept.
    """
    counted = [k for k in kernels if k.metrics and ncu_duration_ns(k)]
    if not counted:
        return None
    flops: dict[str, float] = {}
    dram_total: float | None = None
    duration = 0.0
    cycles_mhz_ns = 0.0
    clocked_ns = 0.0
    for kernel in counted:
        for precision, value in kernel_flops(kernel).items():
            flops[precision] = flops.get(precision, 0.0) + value
        moved = dram_bytes(kernel)
        if moved is not None:
            dram_total = (dram_total or 0.0) + moved
        ns = ncu_duration_ns(kernel) or 0.0
        duration += ns
        clock = sm_clock_mhz(kernel)
        if clock:
            cycles_mhz_ns += clock * ns
            clocked_ns += ns
    clock_mhz = cycles_mhz_ns / clocked_ns if clocked_ns else (device.base_clock_mhz if device else None)
    return roofline_from_counts(flops, dram_total, duration, clock_mhz, device)
