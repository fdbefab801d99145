"""Read an Nsight Systems SQLite export into `TraceKernel`s of the measured window.

Each kernel is tied to the CUDA API call that launched it (runtime or driver, by correlation id), which gives
its launching thread, its launch time and so its launch order. Only kernels launched inside the
`operator_profiler::measure` NVTX range are kept. The stack of NVTX push/pop ranges that enclose each launch
on its thread (outermost first) is rebuilt by one sweep: the kernels stream out of one query in launch order,
the ranges out of another in start order (outer first), and each range is pushed onto its thread's stack once
the launches reach its start and dropped once it has closed. Memory holds the ranges open at the current
launch, never the whole table, and only ranges that enclose a launch are parsed. Every table and column name
comes from tables.yaml beside this module.

`read_nsys_sqlite` returns the whole window as pydantic records; `NsysWindow` streams it as light
`WindowKernel`s for the assembly of very large captures.
"""

from __future__ import annotations

import sqlite3
import sys
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Field

from mcp_server.children.contract import MEASURE_RANGE
from mcp_server.schema.records import Frame, TraceKernel
from plugins.bulk import gc_paused
from plugins.nvtx_names import (
    FIELD_SEPARATOR,
    MODULE_PREFIX,
    is_operator,
    parse_range,
    parse_sizes,
    range_name,
)

TABLES_FILE = Path(__file__).with_name("tables.yaml")
T = TypeVar("T")
_OPEN_END = 2**63 - 1  # a push/pop range still open when the capture stopped


class NsysExportError(Exception):
    """The file is not an nsys SQLite export this reader understands; the message says what to do."""


class NsysCapture(BaseModel):
    """What an nsys capture holds about the measured window."""

    kernels: list[TraceKernel] = Field(default_factory=list, description="Window kernels in launch order.")
    memcpy_count: int = Field(default=0, description="Memory copies launched inside the window.")
    memset_count: int = Field(default=0, description="Memory sets launched inside the window.")
    memcpy_bytes: int = Field(default=0, description="Bytes moved by the window's memory copies.")
    sync_count: int = Field(default=0, description="CUPTI synchronization records in the whole capture.")
    window_start_ns: int | None = Field(default=None, description="Start of the measure NVTX range, ns.")
    window_end_ns: int | None = Field(default=None, description="End of the measure NVTX range, ns.")
    nvtx_range_count: int = Field(default=0, description="NVTX push/pop ranges in the whole capture.")
    warnings: list[str] = Field(default_factory=list)


@lru_cache(maxsize=1)
def tables() -> dict[str, Any]:
    """Table and column names of the nsys SQLite export (tables.yaml)."""
    return yaml.safe_load(TABLES_FILE.read_text(encoding="utf-8"))


def decode_global_tid(global_tid: int) -> tuple[int, int]:
    """(pid, tid) of an nsys serialized globalTid."""
    spec = tables()["global_tid"]
    return (global_tid >> spec["pid_shift"]) & spec["pid_mask"], global_tid & spec["tid_mask"]


def _q(identifier: str) -> str:
    """Quote an SQL identifier (names come from tables.yaml, never from user input)."""
    return '"' + identifier.replace('"', '""') + '"'


class _Schema:
    """The export's tables and their columns, looked up once."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        self.tables = {row[0] for row in rows}
        self._columns: dict[str, set[str]] = {}

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.conn.execute(f"PRAGMA table_info({_q(table)})").fetchall()
            self._columns[table] = {row[1] for row in rows}
        return self._columns[table]

    def require(self, table: str, *columns: str) -> None:
        missing = [c for c in columns if c not in self.columns(table)]
        if missing:
            raise NsysExportError(
                f"{table} has no column(s) {missing} (the reader expects the nsys {tables()['nsys_version']} "
                f"export schema in {TABLES_FILE.name}); re-export with that nsys version or update {TABLES_FILE}"
            )


class NvtxRange:
    """One NVTX push/pop range: a light frame, classified (as `parse_range` does) only once it encloses a launch.

    Carries the attributes of `Frame` that attribution reads (`name`, `kind`, `start_ns`, `input_shapes`,
    `input_dtypes`; the shapes are parsed on first use); `as_frame()` gives the pydantic `Frame` itself.
    """

    __slots__ = ("start_ns", "end", "text", "min_end", "name", "kind", "_shapes", "_frame")
    input_dtypes = None  # NVTX ranges carry no dtypes

    def __init__(self, start: int, end: int, text: str, min_end: int) -> None:
        self.start_ns = start
        self.end = end  # _OPEN_END while open
        self.text = text
        self.min_end = min_end  # smallest end of this range and those below it on its thread's stack
        self.kind: str | None = None
        self._frame: Frame | None = None

    def classify(self) -> None:
        """Name and kind from the range text (the classification `plugins.nvtx_names.parse_range` makes)."""
        text = self.text
        if text.startswith(MODULE_PREFIX):
            self.name, self.kind = sys.intern(text[len(MODULE_PREFIX) :]), "module"
        else:
            self.name = sys.intern(range_name(text))
            self.kind = "op" if is_operator(self.name) else "annotation"

    @property
    def input_shapes(self) -> list[list[int] | None] | None:
        """The `sizes` field of an operator or annotation range (None for a module range)."""
        try:
            return self._shapes
        except AttributeError:
            text = self.text
            self._shapes = (
                parse_sizes(text) if FIELD_SEPARATOR in text and not text.startswith(MODULE_PREFIX) else None
            )
            return self._shapes

    def as_frame(self) -> Frame:
        if self._frame is None:
            self._frame = parse_range(self.text, self.start_ns, None if self.end == _OPEN_END else self.end)
        return self._frame


class _RangesOutOfOrder(Exception):
    """The NVTX table is not in start order after all: the pass must start again on sorted ranges."""


class _RangeFeed:
    """The push/pop ranges of every thread in start order, pushed onto per-thread stacks as launch time advances.

    `enclosing(thread, t)` must be called with non-decreasing `t`. A range that ends before the launch at hand
    ends before every later one too: it is only counted, never built. `drain()` counts the ranges after the
    last launch. With `check_order`, a range out of (start, end descending) order raises _RangesOutOfOrder.
    """

    BATCH = 4096

    def __init__(self, cursor: sqlite3.Cursor | None, strings: _Strings, check_order: bool) -> None:
        self.cursor = cursor
        self.check_order = check_order
        self.last = (-_OPEN_END, _OPEN_END)  # (start, end) of the last range seen
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
                    end = _OPEN_END
                if check:
                    if start < last_start or (start == last_start and end > last_end):
                        raise _RangesOutOfOrder
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
        self._advance(_OPEN_END)
        self.stacks.clear()
        self.cached.clear()


class _Windows:
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


@dataclass(slots=True)
class WindowKernel:
    """One window kernel as `NsysWindow` streams it: `TraceKernel`'s fields, its stack as `NvtxRange`s."""

    ordinal: int
    name: str
    mangled_name: str | None
    start_ns: int
    duration_ns: int
    device_id: int | None
    stream_id: int | None
    correlation_id: int | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers_per_thread: int | None
    shared_memory_bytes: int | None
    launch_thread: int | None
    launch_start_ns: int | None
    stack: tuple[NvtxRange, ...]
    linked_op: str | None = None

    def trace_kernel(self) -> TraceKernel:
        """The pydantic record `read_nsys_sqlite` returns."""
        return TraceKernel(
            ordinal=self.ordinal, name=self.name, mangled_name=self.mangled_name, start_ns=self.start_ns,
            duration_ns=self.duration_ns, device_id=self.device_id, stream_id=self.stream_id,
            correlation_id=self.correlation_id, grid=self.grid, block=self.block,
            registers_per_thread=self.registers_per_thread, shared_memory_bytes=self.shared_memory_bytes,
            launch_thread=self.launch_thread, launch_start_ns=self.launch_start_ns,
            stack=[r.as_frame() for r in self.stack],
        )


def _launch_subquery(schema: _Schema, only: str | None = None) -> str | None:
    """SQL of (corr, thread, api_start): the earliest API call per correlation id over runtime and driver tables.

    `only`: SQL of a set of correlation ids to restrict it to (the same rows for those ids, much less work).
    """
    parts = []
    for api in tables()["launch_apis"]:
        if not schema.has(api["table"]):
            if api.get("optional"):
                continue
            raise NsysExportError(
                f"no {api['table']} table in the export; profile with nsys --trace=cuda so launches are recorded"
            )
        schema.require(api["table"], api["correlation_id"], api["thread"], api["start"])
        where = f" WHERE {_q(api['correlation_id'])} IN ({only})" if only else ""
        parts.append(
            f"SELECT {_q(api['correlation_id'])} AS corr, {_q(api['thread'])} AS thread, "
            f"{_q(api['start'])} AS api_start FROM {_q(api['table'])}{where}"
        )
    if not parts:
        return None
    # SQLite returns the bare column `thread` from the row holding MIN(api_start).
    return f"SELECT corr, thread, MIN(api_start) AS api_start FROM ({' UNION ALL '.join(parts)}) GROUP BY corr"


class _NvtxSql:
    """The SQL that reads NVTX push/pop ranges, after checking the table's columns."""

    def __init__(self, schema: _Schema) -> None:
        spec, strings = tables()["nvtx"], tables()["strings"]
        self.present = schema.has(spec["table"])
        if not self.present:
            return
        schema.require(spec["table"], spec["start"], spec["end"], spec["event_type"], spec["thread"])
        cols = schema.columns(spec["table"])
        self.has_text = spec["text"] in cols
        self.has_text_id = spec["text_id"] in cols and schema.has(strings["table"])
        if not (self.has_text or self.has_text_id):
            raise NsysExportError(
                f"{spec['table']} has neither {spec['text']} nor {spec['text_id']}; re-export with nsys"
            )
        self.schema, self.spec, self.strings = schema, spec, strings
        self.table = _q(spec["table"])
        self.where = f"n.{_q(spec['event_type'])} = ?"
        self.push_pop = spec["push_pop_event_type"]

    def measure_ranges(self) -> list[tuple[int, int, int]]:
        """(start, end, thread) of the ranges named `operator_profiler::measure`, sorted; open ends as _OPEN_END.

        The text of a range is its `text`, else the StringIds value of its `textId` (a registered string).
        """
        spec, strings = self.spec, self.strings
        text, text_id = f"n.{_q(spec['text'])}", f"n.{_q(spec['text_id'])}"
        # range_name(text) == MEASURE_RANGE: the text is the name, or the name followed by `, ` and fields.
        named = "({0} = ? OR substr({0}, 1, ?) = ?)"
        prefix = MEASURE_RANGE + ", "
        match_args = (MEASURE_RANGE, len(prefix), prefix)
        registered = (
            f"{text_id} IN (SELECT {_q(strings['id'])} FROM {_q(strings['table'])} "
            f"WHERE {named.format(_q(strings['value']))})"
        )
        if self.has_text and self.has_text_id:
            match = f"(({text} IS NOT NULL AND {named.format(text)}) OR ({text} IS NULL AND {registered}))"
            args = match_args + match_args
        elif self.has_text_id:
            match, args = registered, match_args
        else:
            match, args = named.format(text), match_args
        sql = (
            f"SELECT n.{_q(spec['start'])}, n.{_q(spec['end'])}, n.{_q(spec['thread'])} FROM {self.table} n "
            f"WHERE {self.where} AND {match}"
        )
        rows = self.schema.conn.execute(sql, (self.push_pop, *args)).fetchall()
        return sorted((start, _OPEN_END if end is None else end, thread) for start, end, thread in rows)

    def ranges(self, table_order: bool) -> tuple[sqlite3.Cursor, bool]:
        """(start, end, thread, text, textId) of every push/pop range: by start, then end descending, then table order.

        nsys writes the table in that order: with `table_order` the rows come in table order, unsorted, and the
        second value says that the reader must check the order as they come (see `_RangesOutOfOrder`).
        """
        spec = self.spec
        start, end = f"n.{_q(spec['start'])}", f"n.{_q(spec['end'])}"
        text = f"n.{_q(spec['text'])}" if self.has_text else "NULL"
        text_id = f"n.{_q(spec['text_id'])}" if self.has_text_id else "NULL"
        thread = f"n.{_q(spec['thread'])}"
        select = f"SELECT {start}, {end}, {thread}, {text}, {text_id} FROM {self.table} n WHERE {self.where}"
        end_key = f"COALESCE({end}, {_OPEN_END})"
        conn = self.schema.conn
        try:
            order = "n.rowid" if table_order else f"{start}, {end_key} DESC, n.rowid"
            return conn.execute(f"{select} ORDER BY {order}", (self.push_pop,)), table_order
        except sqlite3.OperationalError:  # a view: no rowid, no table order, no ties broken by it
            return conn.execute(f"{select} ORDER BY {start}, {end_key} DESC", (self.push_pop,)), False


def _kernel_sql(schema: _Schema, launches: str | None) -> str:
    """Window-candidate kernel rows in launch order, with StringIds references (not values) for the names."""
    spec = tables()["kernel"]
    cols = schema.columns(spec["table"])
    name_col = next((c for c in spec["name"] if c in cols), None)
    if name_col is None:
        raise NsysExportError(f"{spec['table']} has none of the name columns {spec['name']}; re-export with nsys")
    schema.require(
        spec["table"], spec["start"], spec["end"], spec["device_id"], spec["stream_id"], spec["correlation_id"],
        *spec["grid"], *spec["block"], spec["registers_per_thread"], *spec["shared_memory"],
    )
    k = {key: f"k.{_q(spec[key])}" for key in ("start", "end", "device_id", "stream_id", "correlation_id")}
    mangled = f"k.{_q(spec['mangled_name'])}" if spec["mangled_name"] in cols else "NULL"
    select = [
        k["start"], k["end"], k["device_id"], k["stream_id"], k["correlation_id"], f"k.{_q(name_col)}", mangled,
        *(f"k.{_q(c)}" for c in spec["grid"]), *(f"k.{_q(c)}" for c in spec["block"]),
        f"k.{_q(spec['registers_per_thread'])}", " + ".join(f"k.{_q(c)}" for c in spec["shared_memory"]),
        "l.thread" if launches else "NULL", "l.api_start" if launches else "NULL",
    ]
    sql = f"SELECT {', '.join(select)} FROM {_q(spec['table'])} k "
    if launches:
        sql += f"LEFT JOIN ({launches}) l ON l.corr = {k['correlation_id']} "
        return sql + f"ORDER BY COALESCE(l.api_start, {k['start']}), {k['start']}, {k['correlation_id']}"
    return sql + f"ORDER BY {k['start']}, {k['correlation_id']}"


class _Strings:
    """StringIds values by id, looked up on first use (an export may hold millions of strings; kernels use few)."""

    def __init__(self, schema: _Schema) -> None:
        strings = tables()["strings"]
        self.sql = f"SELECT {_q(strings['value'])} FROM {_q(strings['table'])} WHERE {_q(strings['id'])} = ?"
        self.conn = schema.conn
        self.values: dict[Any, str | None] = {None: None}

    def __getitem__(self, sid: Any) -> str | None:
        try:
            return self.values[sid]
        except KeyError:
            row = self.conn.execute(self.sql, (sid,)).fetchone()
            value = self.values[sid] = None if row is None else row[0]
            return value


class NsysWindow:
    """An nsys export opened for one pass over its measured window.

    The window's bounds are known on opening; `kernels()` then streams the window kernels in launch order, each
    with the NVTX ranges enclosing its launch, holding only what the current launch needs. `warnings` and
    `nvtx_range_count` are complete once `kernels()` is exhausted. Use as a context manager.
    """

    def __init__(self, path: Path, table_order: bool = True) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"nsys SQLite export not found: {path} (run `nsys export --type=sqlite` first)")
        self.path = path
        self.table_order = table_order
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            with self._sqlite_errors():
                self._open()
        except BaseException:
            self.conn.close()
            raise

    def __enter__(self) -> NsysWindow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def _sqlite_errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise NsysExportError(
                f"{self.path} is not a readable SQLite file ({exc}); re-run `nsys export --type=sqlite`"
            ) from exc

    def _open(self) -> None:
        cfg = tables()
        self.schema = schema = _Schema(self.conn)
        if not schema.has(cfg["strings"]["table"]):
            raise NsysExportError(f"{self.path} has no {cfg['strings']['table']} table: not an nsys SQLite export")
        self.nvtx = _NvtxSql(schema)
        self.measure = self.nvtx.measure_ranges() if self.nvtx.present else []
        self.windows = _Windows(self.measure)
        self.window_start_ns = self.windows.starts[0] if self.windows else None
        self.window_end_ns = None if not self.windows or self.windows.ends[-1] == _OPEN_END else self.windows.ends[-1]
        self.launches = _launch_subquery(schema)
        self.has_kernels = schema.has(cfg["kernel"]["table"])
        self.kernel_sql = None
        if self.has_kernels:
            kernel = cfg["kernel"]
            corrs = f"SELECT {_q(kernel['correlation_id'])} FROM {_q(kernel['table'])}"
            self.kernel_sql = _kernel_sql(schema, _launch_subquery(schema, corrs) if self.launches else None)
        self.nvtx_range_count = 0
        self._warnings: list[str] = []
        self._open_count = 0
        self._consumed = False

    @property
    def warnings(self) -> list[str]:
        """The reader's warnings, in the order `read_nsys_sqlite` gives them."""
        found = []
        if not self.windows:
            found.append(f"no '{MEASURE_RANGE}' NVTX range in the capture: every kernel is kept")
        elif len(self.measure) > 1:
            found.append(
                f"{len(self.measure)} '{MEASURE_RANGE}' ranges in the capture: kernels of all of them are kept"
            )
        if self._open_count:
            found.append(
                f"{self._open_count} NVTX push/pop range(s) never ended (still open when the capture stopped)"
            )
        if not self.has_kernels:
            found.append(f"no {tables()['kernel']['table']} table: the capture recorded no kernels")
        return found + self._warnings

    def kernels(self) -> Iterator[WindowKernel]:
        """The window kernels in launch order (one pass)."""
        if self._consumed:
            raise RuntimeError("NsysWindow.kernels() streams the window once")
        self._consumed = True
        with self._sqlite_errors():
            strings = _Strings(self.schema)
            cursor, check_order = self.nvtx.ranges(self.table_order) if self.nvtx.present else (None, False)
            feed = _RangeFeed(cursor, strings, check_order)
            if self.kernel_sql is not None:
                yield from self._stream(feed, strings)
            feed.drain()
            self.nvtx_range_count, self._open_count = feed.count, feed.open_count

    def _stream(self, feed: _RangeFeed, strings: _Strings) -> Iterator[WindowKernel]:
        measure = self.measure
        starts, ends = self.windows.starts, self.windows.ends  # the window test, inlined: a million calls
        measure_threads = {thread for _, _, thread in measure}
        names = strings.values
        shapes: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        threads: dict[int, int] = {}
        ordinal = outside = unlaunched = foreign = 0
        for row in self.conn.execute(self.kernel_sql):
            start, end, device, stream, corr, name, mangled, gx, gy, gz, bx, by, bz, regs, smem, thread, api_start = row
            if api_start is None:
                unlaunched += 1
                when = start
            else:
                when = api_start
            if starts:
                i = bisect_right(starts, when) - 1
                if i < 0 or when > ends[i]:
                    outside += 1
                    continue
            stack: tuple[NvtxRange, ...] = ()
            tid = None
            if thread is not None:
                if api_start is not None:
                    stack = feed.enclosing(thread, api_start)
                    if measure and thread not in measure_threads:
                        foreign += 1
                tid = threads.get(thread)
                if tid is None:
                    tid = threads[thread] = decode_global_tid(thread)[1]
            grid, block = (gx, gy, gz), (bx, by, bz)
            yield WindowKernel(
                ordinal, (names[name] if name in names else strings[name]) or "",
                names[mangled] if mangled in names else strings[mangled], start, end - start, device, stream, corr,
                shapes.setdefault(grid, grid), shapes.setdefault(block, block), regs, smem, tid, api_start, stack,
            )
            ordinal += 1
        if outside:
            self._warnings.append(f"{outside} kernel(s) launched outside the '{MEASURE_RANGE}' range were dropped")
        if unlaunched:
            self._warnings.append(
                f"{unlaunched} kernel(s) have no launching API call in the export: ordered and windowed by GPU start"
            )
        if foreign:
            self._warnings.append(
                f"{foreign} window kernel(s) were launched from a thread other than the measure range's"
            )

    def check_activity_tables(self) -> None:
        """Raise NsysExportError where `activity_counts` would, without counting (assembly does not need counts)."""
        for key in ("memcpy", "memset"):
            spec = tables()[key]
            if self.schema.has(spec["table"]):
                self.schema.require(
                    spec["table"], spec["start"], spec["correlation_id"], *([spec["bytes"]] if "bytes" in spec else [])
                )

    def activity_counts(self) -> tuple[int, int, int, int]:
        """(memcpy count, memcpy bytes, memset count, synchronization records) of the window / capture."""
        with self._sqlite_errors():
            memcpy_count, memcpy_bytes = self._count_in_window("memcpy")
            memset_count, _ = self._count_in_window("memset")
            sync_table = tables()["synchronization"]["table"]
            sync_count = (
                self.conn.execute(f"SELECT COUNT(*) FROM {_q(sync_table)}").fetchone()[0]
                if self.schema.has(sync_table) else 0
            )
        return memcpy_count, memcpy_bytes, memset_count, sync_count

    def _count_in_window(self, key: str) -> tuple[int, int]:
        """(rows, bytes) of an activity table whose launching call (or, without one, GPU start) is in the window."""
        spec, schema = tables()[key], self.schema
        if not schema.has(spec["table"]):
            return 0, 0
        schema.require(
            spec["table"], spec["start"], spec["correlation_id"], *([spec["bytes"]] if "bytes" in spec else [])
        )
        bytes_sql = f"m.{_q(spec['bytes'])}" if "bytes" in spec else "0"
        corr = _q(spec["correlation_id"])
        launches = _launch_subquery(schema, f"SELECT {corr} FROM {_q(spec['table'])}") if self.launches else None
        if launches:
            sql = (
                f"SELECT COALESCE(l.api_start, m.{_q(spec['start'])}), {bytes_sql} FROM {_q(spec['table'])} m "
                f"LEFT JOIN ({launches}) l ON l.corr = m.{corr}"
            )
        else:
            sql = f"SELECT m.{_q(spec['start'])}, {bytes_sql} FROM {_q(spec['table'])} m"
        count = total = 0
        windows = self.windows
        for when, size in self.conn.execute(sql):
            if not windows or windows.contains(when):
                count += 1
                total += size or 0
        return count, total


def read_nsys_sqlite(path: Path) -> NsysCapture:
    """Read the kernels of the measured window from an nsys SQLite export, in launch order, with NVTX stacks.

    Kernels are ordered by the start of the runtime/driver call that launched them (GPU start breaks ties,
    e.g. the nodes of one CUDA graph launch) and kept only if that call starts inside an
    `operator_profiler::measure` range; without such a range every kernel is kept and a warning says so.
    """
    with gc_paused():
        return read_window(path, _capture)


def _capture(window: NsysWindow) -> NsysCapture:
    kernels = [k.trace_kernel() for k in window.kernels()]
    memcpy_count, memcpy_bytes, memset_count, sync_count = window.activity_counts()
    return NsysCapture(
        kernels=kernels,
        memcpy_count=memcpy_count,
        memset_count=memset_count,
        memcpy_bytes=memcpy_bytes,
        sync_count=sync_count,
        window_start_ns=window.window_start_ns,
        window_end_ns=window.window_end_ns,
        nvtx_range_count=window.nvtx_range_count,
        warnings=window.warnings,
    )


def read_window(path: Path, consume: Callable[[NsysWindow], T]) -> T:
    """`consume(window)` on the export opened as an `NsysWindow`, whose kernels it must stream once.

    The NVTX ranges are first read in table order (nsys writes them in start order: no sort of millions of
    rows); should a range turn up out of order, `consume` runs again from the start on sorted ranges.
    """
    try:
        with NsysWindow(path) as window:
            return consume(window)
    except _RangesOutOfOrder:
        pass
    with NsysWindow(path, table_order=False) as window:
        return consume(window)


