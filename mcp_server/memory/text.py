"""memory.json in words: the section `memory` and `summary` print, and the one screen an out-of-memory error shows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mcp_server.memory.units import size

if TYPE_CHECKING:
    from mcp_server.schema.memory import MemoryHolder, MemoryMoment, MemoryProfile, OomDiagnosis

HOLDERS_SHOWN = 8
OOM_HOLDERS = 3
CATEGORIES_SHOWN = 6
MEMORY_VIZ = "https://pytorch.org/memory_viz"


def holder_line(rank: int, h: MemoryHolder) -> str:
    """One holder: rank, bytes, share, category, module, operator, line."""
    where = "  ".join(part for part in (h.module or "(no module)", h.operator, _short(h.call_site)) if part)
    return f"  {rank:2d}. {size(h.bytes):>11}  {h.share_pct:5.1f} %  {h.category:15s} {where}"


def _short(call_site: str | None) -> str | None:
    """`file.py:42` of a call site's path."""
    if call_site is None:
        return None
    path, _, line = call_site.rpartition(":")
    return f"{Path(path).name}:{line}" if path else call_site


def _categories(moment: MemoryMoment, limit: int = CATEGORIES_SHOWN) -> str:
    return ", ".join(f"{g.key} {size(g.bytes)} ({g.share_pct:.0f} %)" for g in moment.by_category[:limit])


def memory_lines(profile: MemoryProfile, path: Path | None = None, holders: int = HOLDERS_SHOWN) -> list[str]:
    """The memory section: the peaks, what is live at the peak by category, the top holders, the findings."""
    lines = [f"memory ({profile.compile_mode}, {profile.run_mode}"
             + (f", {profile.device_name}" if profile.device_name else "") + "):"]
    if profile.peak_allocated_bytes is not None:
        lines.append(f"  peak allocated {size(profile.peak_allocated_bytes)}, peak reserved "
                     f"{size(profile.peak_reserved_bytes or 0)} (the allocator's own peaks over the window)")
    peak = profile.at_peak
    if peak is not None:
        when = " ".join(part for part in (peak.phase, peak.operator, f"in {peak.module}" if peak.module else None)
                        if part)
        lines.append(f"  at the peak ({peak.offset_us / 1000:.2f} ms{', ' + when if when else ''}): "
                     f"{size(peak.live_bytes)} live in {peak.blocks} blocks, {peak.attributed_pct:.1f} % of them "
                     "attributed to a module")
        lines.append(f"  by category: {_categories(peak)}")
        lines.append("  top holders:")
        lines += [holder_line(i, h) for i, h in enumerate(peak.holders[:holders], 1)]
    if profile.findings:
        lines.append("  what lowers the peak (savings are upper-bound estimates):")
        lines += [f"   - {f.title}: up to {size(f.saving_bytes)} ({f.saving_pct:.0f} % of the peak). {f.change}"
                  for f in profile.findings]
    if path is not None:
        lines.append(f"  memory.json: {path}")
    return lines


def oom_lines(profile: MemoryProfile, oom: OomDiagnosis, path: Path | None = None,
              snapshot: Path | None = None) -> list[str]:
    """One screen: what was being allocated where, what held the memory, what to change."""
    asked = size(oom.requested_bytes) if oom.requested_bytes is not None else "memory"
    what = " ".join(part for part in (oom.operator, f"in {oom.module}" if oom.module else None,
                                      f"at {oom.call_site}" if oom.call_site else None) if part)
    free = (f"; {size(oom.device_free_bytes)} free of {size(oom.device_total_bytes)}"
            if oom.device_free_bytes is not None and oom.device_total_bytes else "")
    lines = [f"out of memory during {oom.phase or oom.stage or 'the run'}: {what or 'the workload'} asked for "
             f"{asked}{free}"]
    lines += [f"    {frame}" for frame in oom.frames[:4]]
    held = oom.held
    if held is not None:
        lines.append(f"held at the failure: {size(held.live_bytes)} in {held.blocks} blocks: {_categories(held)}")
        lines.append("top holders:")
        lines += [holder_line(i, h) for i, h in enumerate(held.holders[:OOM_HOLDERS], 1)]
        modules = ", ".join(f"{g.key} {size(g.bytes)}" for g in held.by_module[:OOM_HOLDERS] if g.key)
        if modules:
            lines.append(f"by module: {modules}")
    lines.append("what to change:")
    lines += [f"  - {f.title}: up to {size(f.saving_bytes)} (upper bound). {f.change}" for f in profile.findings[:4]]
    if not profile.findings:
        lines.append("  - shrink the batch or the sequence length, or run the forward under "
                     "`torch.autocast('cuda', dtype=torch.bfloat16)`")
    if path is not None:
        lines.append(f"memory.json: {path}" + (f"; snapshot (open in {MEMORY_VIZ}): {snapshot}" if snapshot else ""))
    return lines


def headline(profile: MemoryProfile) -> str:
    """One line: the peak and what holds most of it."""
    if profile.oom is not None:
        return oom_lines(profile, profile.oom)[0]
    peak = profile.at_peak
    top = f"; {_categories(peak, 3)}" if peak is not None else ""
    allocated = profile.peak_allocated_bytes
    allocated = allocated if allocated is not None else profile.replayed_peak_bytes
    return f"peak allocated {size(allocated)}, reserved {size(profile.peak_reserved_bytes or 0)}{top}"
