"""The window's speed of light: the least time its kernels could take on this GPU, and how far the window is from it.

Each kernel with counters is bounded below by the larger of its FLOPs at the device's peak (per precision) and its
DRAM bytes at the peak bandwidth; a kernel without counters counts at its measured duration (nothing bounds it
lower). Launches cost at least `estimates.launch_floor_ns` each (an assumption, knowledge/bottleneck_rules.yaml).
The floor is given twice: with the FLOPs in the precisions the kernels ran in, and with every FP32/TF32 FLOP on
BF16 tensor cores (the reduced-precision tier's cheapest): the window over that second floor is the largest
speedup a change can plausibly claim. Peaks are datasheet peaks at boost clocks: the floors are estimates.
"""

from __future__ import annotations

from mcp_server.analysis.devices import precision_key
from mcp_server.analysis.rules import rule
from mcp_server.schema.analysis import DeviceSpec, KernelAnalysis, SpeedOfLight

REDUCED = "bf16_tensor"
REDUCIBLE = ("fp32", "tf32_tensor")  # peak keys whose FLOPs the reduced tier may run on BF16 tensor cores


def _compute_s(flops: dict[str, float], device: DeviceSpec, reduced: bool) -> float | None:
    seconds = 0.0
    for counter_precision, value in flops.items():
        key = precision_key(counter_precision)
        if key is None:
            return None
        if reduced and key in REDUCIBLE and device.peak_flop_per_s.get(REDUCED):
            key = REDUCED
        peak = device.peak_flop_per_s.get(key)
        if not peak:
            return None
        seconds += value / peak
    return seconds


def speed_of_light(kernels: list[KernelAnalysis], device: DeviceSpec | None, window_ns: int,
                   window_source: str) -> SpeedOfLight | None:
    """The window's floors and its distance from them (None without device peaks or kernels)."""
    if device is None or not kernels or window_ns <= 0 or not device.dram_bandwidth_bytes_per_s:
        return None
    floor = reduced_floor = 0.0
    bounded = 0
    for kernel in kernels:
        roof = kernel.roofline
        flops = roof.flop_by_precision if roof else {}
        memory_s = (roof.dram_bytes or 0.0) / device.dram_bandwidth_bytes_per_s if roof else 0.0
        compute_s, reduced_s = _compute_s(flops, device, False), _compute_s(flops, device, True)
        if roof is None or compute_s is None or reduced_s is None or not (flops or roof.dram_bytes):
            floor += kernel.duration_ns
            reduced_floor += kernel.duration_ns
            continue
        bounded += 1
        floor += max(compute_s, memory_s) * 1e9
        reduced_floor += max(reduced_s, memory_s) * 1e9
    launches = len(kernels) * rule("estimates", "launch_floor_ns")
    floor_ns, reduced_ns = int(floor + launches), int(reduced_floor + launches)
    return SpeedOfLight(
        window_ns=window_ns, window_source=window_source, floor_ns=floor_ns, reduced_precision_floor_ns=reduced_ns,
        launch_floor_ns=int(launches), kernels_bounded=bounded, kernels_at_measured_time=len(kernels) - bounded,
        pct_of_speed_of_light=100.0 * floor_ns / window_ns, max_plausible_speedup=window_ns / max(reduced_ns, 1),
        estimate_label="estimate: datasheet peaks at boost clocks, FLOP and DRAM counts from ncu, an assumed "
        f"{rule('estimates', 'launch_floor_ns') / 1e3:.1f} µs per launch; kernels without counters at their "
        "measured time",
    )
