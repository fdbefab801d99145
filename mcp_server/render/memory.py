"""The report's memory section, from memory.json beside the baseline profile (a run with a memory pass)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from mcp_server.memory.text import oom_lines
from mcp_server.memory.units import size
from mcp_server.render.repro import show_path

if TYPE_CHECKING:
    from mcp_server.schema.memory import MemoryHolder, MemoryProfile

HOLDERS_SHOWN = 10


class MemoryFindingView(BaseModel):
    title: str
    saving: str
    saving_pct: float
    estimate: str
    change: str


class MemoryView(BaseModel):
    """What the memory section states."""

    path: str
    chart: str | None
    peak_allocated: str
    peak_reserved: str
    when: str
    live: str
    attributed_pct: float
    categories: list[tuple[str, str, float]]
    holders: list[list[str]]
    findings: list[MemoryFindingView]
    oom: list[str]


def memory_view(profile: MemoryProfile, path: Path, project_dir: Path) -> MemoryView:
    """The memory section of `profile` (memory.json at `path`)."""
    moment = profile.oom.held if profile.oom is not None and profile.oom.held is not None else profile.at_peak
    chart = Path(path).parent / "memory_timeline.png"
    when = ""
    if moment is not None:
        parts = (moment.phase, moment.operator, f"in `{moment.module}`" if moment.module else None)
        when = f"{moment.offset_us / 1000:.2f} ms into the window" + "".join(f", {p}" for p in parts if p)
    return MemoryView(
        path=show_path(path, project_dir), chart=show_path(chart, project_dir) if chart.is_file() else None,
        peak_allocated=size(profile.peak_allocated_bytes or profile.replayed_peak_bytes),
        peak_reserved=size(profile.peak_reserved_bytes or 0), when=when,
        live=size(moment.live_bytes) if moment is not None else "–",
        attributed_pct=moment.attributed_pct if moment is not None else 0.0,
        categories=[(str(g.key), size(g.bytes), g.share_pct) for g in (moment.by_category if moment else [])],
        holders=[holder_cells(h) for h in (moment.holders[:HOLDERS_SHOWN] if moment is not None else [])],
        findings=[MemoryFindingView(title=f.title, saving=size(f.saving_bytes), saving_pct=f.saving_pct,
                                    estimate=f.estimate, change=f.change) for f in profile.findings],
        oom=oom_lines(profile, profile.oom) if profile.oom is not None else [],
    )


def holder_cells(holder: MemoryHolder) -> list[str]:
    """A holder's table cells after its rank: bytes, share, category, module, operator, line."""
    return [size(holder.bytes), f"{holder.share_pct:.1f} %", holder.category, holder.module or "–",
            holder.operator or "–", holder.call_site or "–"]
