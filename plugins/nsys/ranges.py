"""The NVTX push/pop ranges of an nsys export, rebuilt per thread in one sweep as launch time advances."""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from typing import Any

from mcp_server.schema.records import Frame
from plugins.nsys.sql import OPEN_END, Strings
from plugins.nvtx_names import (
    FIELD_SEPARATOR,
    HARNESS_PREFIXES,
    classify_text,
    parse_range,
    parse_seq,
    parse_sizes,
)


class NvtxRange:
    """One NVTX push/pop range: a light frame, classified (as `parse_range` does) only once it encloses a launch.

    Carries the attributes of `Frame` that attribution reads (`name`, `kind`, `start_ns`, `input_shapes`,
    `input_dtypes`; the shapes are parsed on first use); `as_frame()` gives the pydantic `Frame` itself.
    """

    __slots__ = ("start_ns", "end", "text", "min_end", "name", "kind", "_shapes", "_frame")
    input_dtypes = None  # NVTX ranges carry no dtypes
    _shapes: list[list[int] | None] | None  # unset until `input_shapes` is first read

    def __init__(self, start: int, end: int, text: str, min_end: int) -> None:
        self.start_ns = start
        self.end = end  # OPEN_END while open
        self.text = text
        self.min_end = min_end  # smallest end of this range and those below it on its thread's stack
        self.kind: str | None = None
        self._frame: Frame | None = None

    def classify(self) -> None:
        """Name and kind from the range text (the classification `plugins.nvtx_names.parse_range` makes)."""
        self.name, self.kind = classify_text(self.text)

    @property
    def seq(self) -> int | None:
        """The autograd sequence number of an emit_nvtx range, or None."""
        return None if self.kind in ("module", "site") else parse_seq(self.text)

    @property
    def input_shapes(self) -> list[list[int] | None] | None:
        """The `sizes` field of an operator or annotation range (None for a module range)."""
        try:
            return self._shapes
        except AttributeError:
            text = self.text
            self._shapes = (
                parse_sizes(text) if FIELD_SEPARATOR in text and not text.startswith(HARNESS_PREFIXES)
                else None
            )
            return self._shapes

    def as_frame(self) -> Frame:
        if self._frame is None:
            self._frame = parse_range(self.text, self.start_ns, None if self.end == OPEN_END else self.end)
        return self._frame


class RangesOutOfOrder(Exception):
    """The NVTX table is not in start order after all: the pass must start again on sorted ranges."""


class RangeFeed:
    """The push/pop ranges of every thread in start order, pushed onto per-thread stacks as launch time advances.

    `enclosing(thread, t)` must be called with non-decreasing `t`. A range that ends before the launch at hand
    ends before every later one too: it is only counted, never built. `drain()` counts the ranges after the
    last launch. With `check_order`, a range out of (start, end descending) order raises RangesOutOfOrder.
    """

    BATCH = 4096

    def __init__(self, cursor: sqlite3.Cursor | None, strings: Strings, check_order: bool) -> None:
        self.cursor = cursor
        self.check_order = check_order
        self.last = (-OPEN_END, OPEN_END)  # (start, end) of the last range seen
        self.strings = strings  # StringIds values of registered texts, for rows whose text is NULL
        self.batch: list[tuple[Any, ...]] = []
        self.position = 0
        self.next_start: int | None = None  # start of the next range not yet seen; None once all are seen
        self.stacks: dict[int, list[NvtxRange]] = {}
        self.cached: dict[int, tuple[NvtxRange, int, tuple[NvtxRange, ...]]] = {}
        self.count = 0
        self.open_count = 0
        self._refill()

    def _refill(self) -> None:
        """Fetch the next batch of rows once the current one is used up; set `next_start`."""
        if self.position == len(self.batch):
            self.batch = self.cursor.fetchmany(self.BATCH) if self.cursor is not None else []
            self.position = 0
        self.next_start = self.batch[self.position][0] if self.batch else None

    def _advance(self, t: int) -> None:
        """Take in every range that starts at or before `t`."""
        stacks, strings, check = self.stacks, self.strings, self.check_order
        last_start, last_end = self.last
        count = open_count = 0
        while self.next_start is not None and self.next_start <= t:
            batch, position, size = self.batch, self.position, len(self.batch)
            while position < size:
                start, end, thread, text, text_id = batch[position]
                if start > t:
                    break
                position += 1
                count += 1
                if end is None:
                    open_count += 1
                    end = OPEN_END
                if check:
                    if start < last_start or (start == last_start and end > last_end):
                        raise RangesOutOfOrder
                    last_start, last_end = start, end
                if end < t:
                    continue
                if text is None:
                    text = strings[text_id]
                stack = stacks.get(thread)
                if stack is None:
                    stack = stacks[thread] = []
                while stack and stack[-1].end < start:
                    stack.pop()
                below = stack[-1].min_end if stack else end
                stack.append(NvtxRange(start, end, text or "", below if below < end else end))
            self.position = position
            self._refill()
        self.last = (last_start, last_end)
        self.count += count
        self.open_count += open_count

    def enclosing(self, thread: int, t: int) -> tuple[NvtxRange, ...]:
        """The ranges of `thread` with start <= t <= end, outermost first, classified.

        While a thread's stack is unchanged the same tuple is returned, so callers can cache per stack.
        """
        if self.next_start is not None and self.next_start <= t:
            self._advance(t)
        stack = self.stacks.get(thread)
        if not stack:
            return ()
        while stack and stack[-1].end < t:
            stack.pop()
        if not stack:
            return ()
        top = stack[-1]
        if top.min_end < t:
            # An outer range closed before an inner one (mis-nested domains): keep only those still open.
            found = tuple(r for r in stack if r.end >= t)
        else:
            cached = self.cached.get(thread)
            if cached is not None and cached[0] is top and cached[1] == len(stack):
                return cached[2]
            found = tuple(stack)
            self.cached[thread] = (top, len(stack), found)
        for r in found:
            if r.kind is None:
                r.classify()
        return found

    def drain(self) -> None:
        """Take in the ranges after the last launch: counted and their order checked (only never-ended ones built)."""
        self._advance(OPEN_END)
        self.stacks.clear()
        self.cached.clear()


class Windows:
    """The measure ranges as sorted, merged [start, end] intervals."""

    def __init__(self, measure: list[tuple[int, int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end, _ in measure:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]

    def __bool__(self) -> bool:
        return bool(self.starts)

    def contains(self, t: int) -> bool:
        i = bisect_right(self.starts, t) - 1
        return i >= 0 and t <= self.ends[i]


