"""The window's speed of light: the least time its kernels could take on this GPU, and how far the window is from it.

Each kernel with counters is bounded below by the larger of its FLOPs at the device's peak (per precision) and its
DRAM bytes at the peak bandwidth; a kernel without counters counts at its measured duration (nothing bounds it
lower). Launches cost at least `estimates.launch_floor_ns` each (an assumption, knowledge/bottleneck_rules.yaml).
The floor is given twice: with the FLOPs in the precisions the kernels ran in, and with every FP32/TF32 FLOP on
BF16 tensor cores (the reduced-precision tier's cheapest).

A change may do more than run the same kernels faster: fusion removes element-wise and normalisation kernels and
their memory traffic, BF16 halves the bytes of FP32 tensors. The plausibility floor allows all of it: only the
window's GEMM, convolution and attention kernels, and those of ops no compiler fuses (cuDNN's RNNs, sorts...),
remain, on BF16 tensor cores reading half their bytes, each with one launch; every other kernel, and every kernel
without counters, costs nothing. The window over that floor is
the largest speedup a change can plausibly claim (`max_plausible_speedup`). Peaks are datasheet peaks at boost
clocks: the floors are estimates.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

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


def _bounds(kernel: KernelAnalysis, device: DeviceSpec) -> tuple[float, float, float] | None:
    """Seconds at the peaks: as run, with BF16 compute, and with BF16 compute on half the bytes of FP32 data
    (None without counters to bound it)."""
    roof = kernel.roofline
    if roof is None or not (roof.flop_by_precision or roof.dram_bytes):
        return None
    flops = roof.flop_by_precision
    compute_s, reduced_s = _compute_s(flops, device, False), _compute_s(flops, device, True)
    if compute_s is None or reduced_s is None:
        return None
    assert device.dram_bandwidth_bytes_per_s
    memory_s = (roof.dram_bytes or 0.0) / device.dram_bandwidth_bytes_per_s
    fp32 = any(precision_key(p) in REDUCIBLE for p in flops)
    return max(compute_s, memory_s), max(reduced_s, memory_s), max(reduced_s, memory_s / 2 if fp32 else memory_s)


def speed_of_light(kernels: list[KernelAnalysis], device: DeviceSpec | None, window_ns: int, window_source: str,
                   work_kernels: Collection[int] = (), devices: Mapping[int, int | None] | None = None,
                   ) -> SpeedOfLight | None:
    """The window's floors and its distance from them (None without device peaks or kernels). `work_kernels`
    are the GEMM, convolution, attention and opaque ops' kernels: the only ones the plausibility floor keeps.
    `devices` (kernel id -> GPU): kernels on several GPUs could run at once, so each floor is the busiest GPU's."""
    if device is None or not kernels or window_ns <= 0 or not device.dram_bandwidth_bytes_per_s:
        return None
    launch_ns = rule("estimates", "launch_floor_ns")
    per: dict[int | None, list[float]] = {}  # GPU -> [floor, reduced floor, plausible floor], launches included
    bounded = 0
    for kernel in kernels:
        sums = per.setdefault((devices or {}).get(kernel.kernel_id), [0.0, 0.0, 0.0])
        sums[0] += launch_ns
        sums[1] += launch_ns
        bounds = _bounds(kernel, device)
        if bounds is None:
            sums[0] += kernel.duration_ns
            sums[1] += kernel.duration_ns
            continue
        bounded += 1
        sums[0] += bounds[0] * 1e9
        sums[1] += bounds[1] * 1e9
        if kernel.kernel_id in work_kernels:
            sums[2] += bounds[2] * 1e9 + launch_ns
    floor_ns, reduced_ns = int(max(s[0] for s in per.values())), int(max(s[1] for s in per.values()))
    plausible_ns = max(int(max(s[2] for s in per.values())), int(launch_ns))
    several = f"; its kernels ran on {len(per)} GPUs, which could run at once: each floor is the busiest GPU's" \
        if len(per) > 1 else ""
    return SpeedOfLight(
        window_ns=window_ns, window_source=window_source, floor_ns=floor_ns, reduced_precision_floor_ns=reduced_ns,
        launch_floor_ns=int(len(kernels) * launch_ns), kernels_bounded=bounded,
        kernels_at_measured_time=len(kernels) - bounded,
        pct_of_speed_of_light=100.0 * floor_ns / window_ns, plausible_floor_ns=plausible_ns,
        max_plausible_speedup=window_ns / plausible_ns,
        estimate_label="estimate: datasheet peaks at boost clocks, FLOP and DRAM counts from ncu, an assumed "
        f"{launch_ns / 1e3:.1f} µs per launch; kernels without counters at their measured time (none in the "
        f"plausibility floor){several}",
    )
