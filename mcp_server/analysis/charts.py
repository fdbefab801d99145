"""Pictures of the analysis: a roofline chart and a time-by-operator chart (matplotlib, Agg backend).

Files are written through a temporary name and a rename, like every file the tool writes.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from mcp_server.analysis.devices import peak_at_clock
from mcp_server.schema.analysis import Analysis, Bottleneck, TimelineHealth
from mcp_server.schema.io import atomic_path

COLORS = {
    Bottleneck.COMPUTE: "#d62728", Bottleneck.MEMORY: "#1f77b4", Bottleneck.LATENCY: "#ff7f0e",
    Bottleneck.LAUNCH_OVERHEAD: "#9467bd", Bottleneck.HOST: "#8c564b", Bottleneck.UNKNOWN: "#7f7f7f",
}
ROOF_STYLES = {"fp32": "-", "tf32_tensor": "--", "bf16_tensor": "-.", "fp16_tensor": ":", "fp8_tensor": "-",
               "fp64": ":", "fp64_tensor": "--", "fp16": "-"}
TOP_BARS = 12


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: Path) -> None:
    """Write `fig` as a PNG through a temporary name and a rename."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")


def roofline_chart(analysis: Analysis, path: Path) -> Path | None:
    """Log-log roofline: one point per kernel with counters, roofs at the median ncu replay clock.

    Returns None (and writes nothing) when no kernel has both FLOPs and DRAM bytes, or no device peaks exist.
    """
    device = analysis.device
    # (kernel, its roofline, intensity FLOP/byte, achieved FLOP/s) of each kernel with both numbers.
    points = [(k, k.roofline, k.roofline.arithmetic_intensity_flop_per_byte, k.roofline.achieved_flop_per_s)
              for k in analysis.kernels if k.roofline and k.roofline.arithmetic_intensity_flop_per_byte
              and k.roofline.achieved_flop_per_s]
    if device is None or not device.dram_bandwidth_bytes_per_s or not points:
        return None
    plt = pyplot()
    clocks = [roof.sm_clock_mhz for _, roof, _, _ in points if roof.sm_clock_mhz]
    clock = statistics.median(clocks) if clocks else None
    intensities = [intensity for _, _, intensity, _ in points]
    used = {roof.precision for _, roof, _, _ in points if roof.precision}
    shown = [p for p in device.peak_flop_per_s if p in used or p in ("fp32", "tf32_tensor", "bf16_tensor")]
    # Every shown precision has a peak (it is a key of peak_flop_per_s), so peak_at_clock never gives None here.
    peaks = {p: peak for p in shown if (peak := peak_at_clock(device, p, clock)) is not None}
    lo = min(min(intensities) / 4, 0.01)
    hi = max(max(intensities) * 4, max(peaks.values()) / device.dram_bandwidth_bytes_per_s * 4)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    bw = device.dram_bandwidth_bytes_per_s
    for precision, peak in peaks.items():
        ridge = peak / bw
        ax.plot([lo, ridge, hi], [lo * bw, peak, peak], ROOF_STYLES.get(precision, "-"), color="black", lw=1)
        ax.annotate(f"{precision} {peak / 1e12:.1f} TFLOP/s", (hi, peak), ha="right", va="bottom", fontsize=7)
    ax.annotate(f"DRAM {bw / 1e9:.0f} GB/s", (lo * 1.5, lo * 1.5 * bw), fontsize=7, rotation=30)
    for cls in Bottleneck:
        members = [point for point in points if point[0].bottleneck == cls]
        if members:
            ax.scatter([intensity for _, _, intensity, _ in members],
                       [achieved for _, _, _, achieved in members],
                       s=[max(12.0, k.duration_ns / 100) for k, _, _, _ in members], color=COLORS[cls], alpha=0.7,
                       label=f"{cls.value} ({len(members)})", edgecolors="none")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte of DRAM traffic)")
    ax.set_ylabel("achieved FLOP/s (ncu counts over ncu duration)")
    skipped = len(analysis.kernels) - len(points)
    clock_text = f"roofs at the median ncu replay clock {clock:.0f} MHz" if clock else "roofs at published clocks"
    origin = "measured by microbenchmark" if device.measured else f"datasheet (knowledge/devices.yaml: {device.key})"
    ax.set_title(f"{device.name}: {len(points)} kernels ({skipped} without FLOPs or DRAM bytes not shown)\n"
                 f"{clock_text}; peaks {origin}", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    save_png(fig, path)
    plt.close(fig)
    return path


GAP_COLORS = {"head": "#c7c7c7", "launch_bound": "#c5b0d5", "host_overhead": "#c49c94", "host_sync": "#f7b6d2",
              "tail": "#dbdb8d"}


def _window_panel(ax: Any, t: TimelineHealth) -> None:
    """One stacked bar: GPU busy time and idle time by likely cause, over the window."""
    parts = [("GPU busy", t.gpu_busy_ns, "#2ca02c")]
    parts += [(f"idle: {cause}", ns, GAP_COLORS.get(cause, "#c7c7c7")) for cause, ns in t.idle_by_cause_ns.items()]
    left = 0.0
    for label, ns, color in parts:
        ax.barh([0], [ns / 1e3], left=left, color=color, label=f"{label} {ns / 1e3:.1f} us")
        left += ns / 1e3
    ax.set_yticks([0], ["window"], fontsize=7)
    ax.set_xlabel("time (us)")
    ax.set_title(f"window {t.window_ns / 1e3:.1f} us: GPU busy {t.gpu_utilization_pct:.1f} %", fontsize=9)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=3)


def time_by_operator_chart(analysis: Analysis, path: Path) -> Path | None:
    """GPU kernel time per stage (module or operator), coloured by class, above the window's busy/idle split.

    CPU-only analyses chart CPU self time per operator instead. Returns None when there is nothing to draw.
    """
    plt = pyplot()
    if analysis.gpu_data:
        rows = [(s.label, s.duration_ns / 1e3, COLORS[s.bottleneck]) for s in analysis.stages[:TOP_BARS]]
        xlabel, title = "kernel time (us)", "GPU kernel time by module/operator, coloured by bottleneck"
    else:
        rows = [(h.operator_name, h.cpu_self_time_ns / 1e3, COLORS[Bottleneck.HOST])
                for h in analysis.cpu_hotspots[:TOP_BARS]]
        xlabel, title = "CPU self time (us)", "CPU-only profile: no GPU data; CPU self time by operator"
    if not rows:
        return None
    timeline = analysis.timeline if analysis.gpu_data else None
    window = timeline is not None
    height = 0.3 * len(rows) + (3.0 if window else 1.5)
    fig = plt.figure(figsize=(8, height))
    grid = fig.add_gridspec(2 if window else 1, 1, height_ratios=[max(len(rows), 2), 2] if window else [1])
    ax = fig.add_subplot(grid[0])
    labels = [label if len(label) <= 40 else label[:39] + "…" for label, _, _ in rows]
    ax.barh(range(len(rows)), [v for _, v, _ in rows], color=[c for _, _, c in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    if analysis.gpu_data:
        used = [c for c in Bottleneck if any(s.bottleneck == c for s in analysis.stages[:TOP_BARS])]
        handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in used]
        ax.legend(handles, [c.value for c in used], fontsize=6, loc="lower right")
    if timeline is not None:
        _window_panel(fig.add_subplot(grid[1]), timeline)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path
