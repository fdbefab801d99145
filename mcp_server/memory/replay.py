"""Replaying the allocator's history: every block's life (allocated at one trace entry, freed at another), the
allocated and reserved bytes after each entry, the peak, and the failed request of an out-of-memory error.

Bytes are the allocator's: a trace entry gives the requested size, which the allocator rounds up to 512 bytes; a
block the snapshots show (before or after the trace) counts at its block size. Reserved bytes follow the segments
cudaMalloc'd, freed, mapped and unmapped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mcp_server.memory.snapshot import SnapshotState

GRANULE = 512  # the caching allocator's smallest block and rounding step
GROWS = ("segment_alloc", "segment_map")
SHRINKS = ("segment_free", "segment_unmap")
CLOCK_TOLERANCE_US = 1000  # a "snapshot" entry this close before the start snapshot's time is its own


def rounded(size: int) -> int:
    """The block size the allocator hands out for a request of `size` bytes (before any unsplit remainder)."""
    return max(GRANULE, -(-size // GRANULE) * GRANULE)


@dataclass(slots=True)
class Block:
    """One allocation's life. `alloc_index` -1: held before the trace began; `free_index` None: never freed."""

    address: int
    bytes: int
    requested: int
    alloc_index: int
    alloc_us: int | None
    stream: int
    frames: list[dict[str, Any]] = field(default_factory=list)
    free_index: int | None = None
    free_us: int | None = None

    def live_at(self, index: int) -> bool:
        """Whether the block is allocated after trace entry `index`."""
        return self.alloc_index <= index and (self.free_index is None or self.free_index > index)


@dataclass(frozen=True, slots=True)
class Step:
    """The allocated and reserved bytes after trace entry `index` (-1: the state the trace starts from)."""

    index: int
    time_us: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class FailedRequest:
    """The `oom` entry: a request the allocator could not satisfy."""

    index: int
    time_us: int
    requested: int
    device_free: int
    frames: list[dict[str, Any]]


@dataclass
class Replay:
    """The blocks and the byte counts of a trace replayed from a snapshot's state."""

    blocks: list[Block]
    steps: list[Step]
    oom: FailedRequest | None
    unmatched_frees: int
    entries: int

    def peak(self, start_us: int | None = None, end_us: int | None = None) -> Step:
        """The first step with the most allocated bytes between `start_us` and `end_us` (all steps by default)."""
        inside = [s for s in self.steps if (start_us is None or s.time_us >= start_us)
                  and (end_us is None or s.time_us <= end_us)] or self.steps[:1]
        return max(inside, key=lambda s: (s.allocated, -s.index))

    def live(self, index: int) -> list[Block]:
        """The blocks allocated after trace entry `index`."""
        return [b for b in self.blocks if b.live_at(index)]


def trace_start(entries: list[dict[str, Any]], start_us: int | None, cleared: bool | None) -> int:
    """The first entry after the start snapshot: 0 when the history was cleared right after it; else the entry after
    the snapshot's own `snapshot` entry, or the first one at or after its time."""
    if cleared or start_us is None:
        return 0
    marks = [i for i, e in enumerate(entries)
             if e.get("action") == "snapshot" and int(e.get("time_us", 0)) <= start_us + CLOCK_TOLERANCE_US]
    if marks:
        return marks[-1] + 1
    return next((i for i, e in enumerate(entries) if int(e.get("time_us", 0)) >= start_us), len(entries))


def clock_offset_us(entries: list[dict[str, Any]], markers: Iterable[tuple[int, int]], marker_bytes: int | None) -> int:
    """Microseconds to add to the allocator's times so that each marker allocation falls between the two readings
    of the harness's clock taken around it (0 when they already do)."""
    if not marker_bytes:
        return 0
    times = [int(e["time_us"]) for e in entries if e.get("action") == "alloc" and e.get("size") == marker_bytes]
    offsets = []
    for (before_ns, after_ns), at_us in zip(markers, times, strict=False):
        if (at_us + 1) * 1000 <= before_ns:
            offsets.append((before_ns - at_us * 1000) // 1000)
        elif at_us * 1000 > after_ns:
            offsets.append(-((at_us * 1000 - after_ns + 999) // 1000))
        else:
            offsets.append(0)
    return round(sum(offsets) / len(offsets)) if offsets else 0


def replay(start: SnapshotState, entries: list[dict[str, Any]], end: SnapshotState | None = None,
           marker_bytes: int | None = None, offset_us: int = 0) -> Replay:
    """Replay `entries` from the state `start`; blocks still allocated at `end` take the block size it shows."""
    blocks = [Block(b.address, b.size, b.requested_size, -1, None, b.stream, b.frames) for b in start.blocks.values()]
    live = {b.address: b for b in blocks}
    markers: set[int] = set()
    segments: list[tuple[int, int]] = []
    oom = None
    unmatched = 0
    for index, entry in enumerate(entries):
        action = entry.get("action")
        at = int(entry.get("time_us", 0)) + offset_us
        size = int(entry.get("size", 0))
        if action == "alloc":
            address = int(entry.get("addr", 0))
            if marker_bytes and size == marker_bytes:
                markers.add(address)
                continue
            block = Block(address, rounded(size), size, index, at, int(entry.get("stream", 0)),
                          list(entry.get("frames") or []))
            blocks.append(block)
            live[address] = block
        elif action == "free_requested":
            address = int(entry.get("addr", 0))
            freed = live.pop(address, None)
            if freed is not None:
                freed.free_index, freed.free_us = index, at
            elif address in markers:
                markers.discard(address)
            else:
                unmatched += 1
        elif action in GROWS or action in SHRINKS:
            segments.append((index, size if action in GROWS else -size))
        elif action == "oom":
            oom = FailedRequest(index, at, size, int(entry.get("device_free", 0)), list(entry.get("frames") or []))
    if end is not None:
        for address, block in live.items():
            shown = end.blocks.get(address)
            if shown is not None and shown.requested_size == block.requested:
                block.bytes = shown.size
    return Replay(blocks, _steps(blocks, segments, entries, start, oom, offset_us), oom, unmatched, len(entries))


def _steps(blocks: list[Block], segments: list[tuple[int, int]], entries: list[dict[str, Any]],
           start: SnapshotState, oom: FailedRequest | None, offset_us: int) -> list[Step]:
    changes: dict[int, list[int]] = {}
    allocated = 0
    for block in blocks:
        if block.alloc_index < 0:
            allocated += block.bytes
        else:
            changes.setdefault(block.alloc_index, [0, 0])[0] += block.bytes
        if block.free_index is not None:
            changes.setdefault(block.free_index, [0, 0])[0] -= block.bytes
    for index, delta in segments:
        changes.setdefault(index, [0, 0])[1] += delta
    if oom is not None:
        changes.setdefault(oom.index, [0, 0])
    reserved = start.reserved_bytes
    first = int(entries[0].get("time_us", 0)) + offset_us if entries else 0
    steps = [Step(-1, first, allocated, reserved)]
    for index in sorted(changes):
        allocated += changes[index][0]
        reserved += changes[index][1]
        steps.append(Step(index, int(entries[index].get("time_us", 0)) + offset_us, allocated, reserved))
    return steps
