"""What was live at one moment, grouped (by category, module, operator, call site, and as holders), and the
window's timeline of allocated and reserved bytes, downsampled so that a long history stays small and its peak
stays exact."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from mcp_server.memory.attribute import Attributed
from mcp_server.memory.replay import Step
from mcp_server.schema.memory import MemoryGroup, MemoryHolder, MemoryMoment, MemoryRecord, PhaseSpan, TimelinePoint
from mcp_server.schema.profile import Phase

TOP_GROUPS = 15
TOP_HOLDERS = 25
TIMELINE_POINTS = 1200
K = TypeVar("K", bound=Hashable)


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def _totals(blocks: list[Attributed], key: Callable[[Attributed], K]) -> list[tuple[K, int, int]]:
    sums: dict[K, list[int]] = {}
    for entry in blocks:
        found = sums.setdefault(key(entry), [0, 0])
        found[0] += entry.block.bytes
        found[1] += 1
    return sorted(((k, v[0], v[1]) for k, v in sums.items()), key=lambda row: (-row[1], str(row[0])))


def groups(blocks: list[Attributed], key: Callable[[Attributed], str | None], total: int,
           limit: int = TOP_GROUPS) -> list[MemoryGroup]:
    """Bytes and blocks per key, heaviest first, the first `limit`."""
    return [MemoryGroup(key=k, bytes=b, blocks=n, share_pct=_pct(b, total))
            for k, b, n in _totals(blocks, key)[:limit]]


def holders(blocks: list[Attributed], total: int, limit: int = TOP_HOLDERS) -> list[MemoryHolder]:
    """Blocks sharing category, module, operator, call site and allocating phase, heaviest first."""
    rows = _totals(blocks, lambda e: (e.category, e.module, e.operator, e.call_site, e.phase))
    return [MemoryHolder(category=k[0], module=k[1], operator=k[2], call_site=k[3], phase=k[4], bytes=b, blocks=n,
                         share_pct=_pct(b, total)) for k, b, n in rows[:limit]]


def moment(live: list[Attributed], offset_us: int, phase: Phase | None = None, operator: str | None = None,
           module: str | None = None) -> MemoryMoment:
    """The live blocks of one moment, grouped; `phase`, `operator` and `module` say what was running."""
    total = sum(e.block.bytes for e in live)
    with_module = sum(e.block.bytes for e in live if e.module is not None)
    return MemoryMoment(
        offset_us=offset_us, phase=phase, operator=operator, module=module, live_bytes=total, blocks=len(live),
        attributed_pct=_pct(with_module, total),
        by_category=groups(live, lambda e: e.category, total, limit=20),
        by_module=groups(live, lambda e: e.module, total), by_operator=groups(live, lambda e: e.operator, total),
        by_call_site=groups(live, lambda e: e.call_site, total), holders=holders(live, total),
    )


def timeline(steps: list[Step], origin_us: int, start_us: int | None, end_us: int | None, peak: Step,
             limit: int = TIMELINE_POINTS) -> list[TimelinePoint]:
    """The steps between `start_us` and `end_us` as points; past `limit`, each bucket of steps keeps its lowest and
    highest allocation, in order, and the peak is always kept."""
    inside = [s for s in steps
              if (start_us is None or s.time_us >= start_us) and (end_us is None or s.time_us <= end_us)]
    if len(inside) > limit:
        size = -(-len(inside) * 2 // limit)
        kept: list[Step] = []
        for first in range(0, len(inside), size):
            bucket = inside[first:first + size]
            low, high = min(bucket, key=lambda s: s.allocated), max(bucket, key=lambda s: s.allocated)
            kept += sorted({low.index: low, high.index: high}.values(), key=lambda s: s.index)
        if peak not in kept:
            kept = sorted([*kept, peak], key=lambda s: s.index)
        inside = kept
    return [TimelinePoint(offset_us=s.time_us - origin_us, allocated_bytes=s.allocated, reserved_bytes=s.reserved)
            for s in inside]


def phase_spans(record: MemoryRecord, origin_ns: int) -> list[PhaseSpan]:
    """Each iteration's forward part (up to its first backward or optimizer span), backward passes and optimizer
    steps, in microseconds from the origin."""

    def us(at_ns: int) -> int:
        return (at_ns - origin_ns) // 1000

    spans: list[PhaseSpan] = []
    for start, end in record.iterations:
        inner = [s for s, _ in (*record.backward, *record.optimizer) if start <= s <= end]
        spans.append(PhaseSpan(phase="forward", start_us=us(start), end_us=us(min(inner, default=end))))
    for phase, found in (("backward", record.backward), ("optimizer", record.optimizer)):
        spans += [PhaseSpan(phase=phase, start_us=us(s), end_us=us(e)) for s, e in found]  # type: ignore[arg-type]
    return sorted(spans, key=lambda s: s.start_us)
