"""The memory timeline chart: allocated and reserved bytes over the window, its phases shaded, the peak marked
(matplotlib, Agg backend; written through a temporary name and a rename)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp_server.memory.units import GIB, size
from mcp_server.schema.io import atomic_path
from mcp_server.schema.memory import MemoryProfile

PHASE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c"}


def timeline_chart(profile: MemoryProfile, path: Path) -> Path | None:
    """Write the chart of `profile`'s timeline to `path`; None (nothing written) when it has fewer than 2 points."""
    points = profile.timeline
    if len(points) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [p.offset_us / 1000 for p in points]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.step(ms, [p.reserved_bytes / GIB for p in points], where="post", color="#7f7f7f", lw=1.2, label="reserved")
    ax.step(ms, [p.allocated_bytes / GIB for p in points], where="post", color="#d62728", lw=1.4, label="allocated")
    shaded: set[str] = set()
    for span in profile.phases:
        label = span.phase if span.phase not in shaded else None
        shaded.add(span.phase)
        ax.axvspan(span.start_us / 1000, max(span.end_us, span.start_us + 1) / 1000, color=PHASE_COLORS[span.phase],
                   alpha=0.12, lw=0, label=label)
    _mark_peak(ax, profile)
    ax.set_xlabel("ms since the window's start" if profile.window_us else "ms since the history's start")
    ax.set_ylabel("GiB")
    title = f"{Path(profile.workload).name}: memory over the window ({profile.compile_mode}, {profile.run_mode})"
    if profile.oom is not None:
        title = f"{Path(profile.workload).name}: memory up to the failed allocation"
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    plt.close(fig)
    return path


def _mark_peak(ax: Any, profile: MemoryProfile) -> None:
    peak = profile.at_peak
    if peak is None:
        return
    x, y = peak.offset_us / 1000, profile.replayed_peak_bytes / GIB
    where = " ".join(part for part in (peak.phase, peak.module) if part)
    ax.plot([x], [y], "v", color="black", ms=7)
    ax.annotate(f"peak {size(profile.replayed_peak_bytes)}" + (f"\n{where}" if where else ""), (x, y),
                xytext=(6, 4), textcoords="offset points", fontsize=8)
