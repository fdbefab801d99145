"""Read an Nsight Systems SQLite export into `TraceKernel`s of the measured window.

Each kernel is tied to the CUDA API call that launched it (runtime or driver, by correlation id), which gives
its launching thread, its launch time and so its launch order. Only kernels launched inside the
`operator_profiler::measure` NVTX range are kept. The stack of NVTX push/pop ranges that enclose each launch
on its thread (outermost first) is rebuilt by sorting each thread's ranges once and sweeping them along the
launches (never kernels x ranges); only ranges that enclose a launch are parsed. Every table and column name
comes from tables.yaml beside this module.
"""

from __future__ import annotations

import gc
import sqlite3
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from mcp_server.schema.records import Frame, TraceKernel
from plugins.nvtx_names import MEASURE_RANGE, parse_range, range_name

TABLES_FILE = Path(__file__).with_name("tables.yaml")
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


class _Range:
    """One NVTX push/pop range; its `Frame` is built only if a kernel launch falls inside it."""

    __slots__ = ("start", "end", "text", "frame")

    def __init__(self, start: int, end: int, text: str) -> None:
        self.start = start
        self.end = end
        self.text = text
        self.frame: Frame | None = None

    def as_frame(self) -> Frame:
        if self.frame is None:
            end = None if self.end == _OPEN_END else self.end
            self.frame = parse_range(self.text, self.start, end)
        return self.frame


class _ThreadSweep:
    """The ranges of one thread, visited at its launch times in increasing order (one pass, amortised O(1))."""

    __slots__ = ("pending", "next", "open")

    def __init__(self, ranges: list[_Range]) -> None:
        self.pending: list[_Range | None] = list(ranges)  # sorted by start, outer first
        self.next = 0
        self.open: list[_Range] = []  # nested push/pop ranges: innermost last

    def enclosing(self, t: int) -> list[Frame]:
        """Frames of the ranges with start <= t <= end, outermost first; `t` must not decrease between calls."""
        pending, open_ranges = self.pending, self.open
        while self.next < len(pending):
            new = pending[self.next]
            if new is None or new.start > t:
                break
            pending[self.next] = None  # held by `open` while it is open; freed once it closes
            self.next += 1
            while open_ranges and open_ranges[-1].end < new.start:
                open_ranges.pop()
            open_ranges.append(new)
        while open_ranges and open_ranges[-1].end < t:
            open_ranges.pop()
        # The filter also drops an outer range that closed before an inner one (mis-nested domains).
        return [r.as_frame() for r in open_ranges if r.end >= t]


def _launch_subquery(schema: _Schema) -> str | None:
    """SQL of (corr, thread, api_start): the earliest API call per correlation id over runtime and driver tables."""
    parts = []
    for api in tables()["launch_apis"]:
        if not schema.has(api["table"]):
            if api.get("optional"):
                continue
            raise NsysExportError(
                f"no {api['table']} table in the export; profile with nsys --trace=cuda so launches are recorded"
            )
        schema.require(api["table"], api["correlation_id"], api["thread"], api["start"])
        parts.append(
            f"SELECT {_q(api['correlation_id'])} AS corr, {_q(api['thread'])} AS thread, "
            f"{_q(api['start'])} AS api_start FROM {_q(api['table'])}"
        )
    if not parts:
        return None
    # SQLite returns the bare column `thread` from the row holding MIN(api_start).
    return f"SELECT corr, thread, MIN(api_start) AS api_start FROM ({' UNION ALL '.join(parts)}) GROUP BY corr"


def _read_nvtx(schema: _Schema) -> tuple[dict[int, list[_Range]], list[tuple[int, int, int]], int, int]:
    """Push/pop ranges per thread (sorted by start, outer first), the measure ranges, range and open-range counts."""
    spec, strings = tables()["nvtx"], tables()["strings"]
    if not schema.has(spec["table"]):
        return {}, [], 0, 0
    schema.require(spec["table"], spec["start"], spec["end"], spec["event_type"], spec["thread"])
    cols = schema.columns(spec["table"])
    has_text, has_text_id = spec["text"] in cols, spec["text_id"] in cols and schema.has(strings["table"])
    if has_text and has_text_id:
        text_sql, join = f"COALESCE(n.{_q(spec['text'])}, s.{_q(strings['value'])})", True
    elif has_text_id:
        text_sql, join = f"s.{_q(strings['value'])}", True
    elif has_text:
        text_sql, join = f"n.{_q(spec['text'])}", False
    else:
        raise NsysExportError(f"{spec['table']} has neither {spec['text']} nor {spec['text_id']}; re-export with nsys")
    join_sql = (
        f" LEFT JOIN {_q(strings['table'])} s ON s.{_q(strings['id'])} = n.{_q(spec['text_id'])}" if join else ""
    )
    sql = (
        f"SELECT n.{_q(spec['start'])}, n.{_q(spec['end'])}, n.{_q(spec['thread'])}, {text_sql} "
        f"FROM {_q(spec['table'])} n{join_sql} WHERE n.{_q(spec['event_type'])} = ?"
    )
    by_thread: dict[int, list[_Range]] = {}
    measure: list[tuple[int, int, int]] = []
    count = open_count = 0
    for start, end, thread, text in schema.conn.execute(sql, (spec["push_pop_event_type"],)):
        count += 1
        if end is None:
            open_count += 1
            end = _OPEN_END
        text = text or ""
        if range_name(text) == MEASURE_RANGE:
            measure.append((start, end, thread))
        by_thread.setdefault(thread, []).append(_Range(start, end, text))
    for ranges in by_thread.values():
        ranges.sort(key=lambda r: (r.start, -r.end))
    measure.sort()
    return by_thread, measure, count, open_count


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


def _count_in_window(schema: _Schema, key: str, launches: str | None, windows: _Windows) -> tuple[int, int]:
    """(rows, bytes) of an activity table whose launching call (or, without one, GPU start) is in the window."""
    spec = tables()[key]
    if not schema.has(spec["table"]):
        return 0, 0
    schema.require(spec["table"], spec["start"], spec["correlation_id"], *([spec["bytes"]] if "bytes" in spec else []))
    bytes_sql = f"m.{_q(spec['bytes'])}" if "bytes" in spec else "0"
    if launches:
        sql = (
            f"SELECT COALESCE(l.api_start, m.{_q(spec['start'])}), {bytes_sql} FROM {_q(spec['table'])} m "
            f"LEFT JOIN ({launches}) l ON l.corr = m.{_q(spec['correlation_id'])}"
        )
    else:
        sql = f"SELECT m.{_q(spec['start'])}, {bytes_sql} FROM {_q(spec['table'])} m"
    count = total = 0
    for when, size in schema.conn.execute(sql):
        if not windows or windows.contains(when):
            count += 1
            total += size or 0
    return count, total


def _kernel_sql(schema: _Schema, launches: str | None) -> str:
    spec, strings = tables()["kernel"], tables()["strings"]
    cols = schema.columns(spec["table"])
    name_col = next((c for c in spec["name"] if c in cols), None)
    if name_col is None:
        raise NsysExportError(f"{spec['table']} has none of the name columns {spec['name']}; re-export with nsys")
    schema.require(
        spec["table"], spec["start"], spec["end"], spec["device_id"], spec["stream_id"], spec["correlation_id"],
        *spec["grid"], *spec["block"], spec["registers_per_thread"], *spec["shared_memory"],
    )
    sid, sval = _q(strings["id"]), _q(strings["value"])
    st = _q(strings["table"])
    k = {key: f"k.{_q(spec[key])}" for key in ("start", "end", "device_id", "stream_id", "correlation_id")}
    mangled = f"sm.{sval}" if spec["mangled_name"] in cols else "NULL"
    select = [
        k["start"], k["end"], k["device_id"], k["stream_id"], k["correlation_id"], f"sn.{sval}", mangled,
        *(f"k.{_q(c)}" for c in spec["grid"]), *(f"k.{_q(c)}" for c in spec["block"]),
        f"k.{_q(spec['registers_per_thread'])}", " + ".join(f"k.{_q(c)}" for c in spec["shared_memory"]),
        "l.thread" if launches else "NULL", "l.api_start" if launches else "NULL",
    ]
    sql = (
        f"SELECT {', '.join(select)} FROM {_q(spec['table'])} k "
        f"LEFT JOIN {st} sn ON sn.{sid} = k.{_q(name_col)} "
    )
    if spec["mangled_name"] in cols:
        sql += f"LEFT JOIN {st} sm ON sm.{sid} = k.{_q(spec['mangled_name'])} "
    if launches:
        sql += f"LEFT JOIN ({launches}) l ON l.corr = {k['correlation_id']} "
        return sql + f"ORDER BY COALESCE(l.api_start, {k['start']}), {k['start']}, {k['correlation_id']}"
    return sql + f"ORDER BY {k['start']}, {k['correlation_id']}"


def read_nsys_sqlite(path: Path) -> NsysCapture:
    """Read the kernels of the measured window from an nsys SQLite export, in launch order, with NVTX stacks.

    Kernels are ordered by the start of the runtime/driver call that launched them (GPU start breaks ties,
    e.g. the nodes of one CUDA graph launch) and kept only if that call starts inside an
    `operator_profiler::measure` range; without such a range every kernel is kept and a warning says so.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"nsys SQLite export not found: {path} (run `nsys export --type=sqlite` first)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        with _gc_paused():
            return _read(_Schema(conn), path)
    except sqlite3.DatabaseError as exc:
        raise NsysExportError(
            f"{path} is not a readable SQLite file ({exc}); re-run `nsys export --type=sqlite`"
        ) from exc
    finally:
        conn.close()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of acyclic records are built (halves the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _read(schema: _Schema, path: Path) -> NsysCapture:
    cfg = tables()
    warnings: list[str] = []
    if not schema.has(cfg["strings"]["table"]):
        raise NsysExportError(f"{path} has no {cfg['strings']['table']} table: not an nsys SQLite export")
    by_thread, measure, nvtx_count, open_count = _read_nvtx(schema)
    windows = _Windows(measure)
    if not windows:
        warnings.append(f"no '{MEASURE_RANGE}' NVTX range in the capture: every kernel is kept")
    elif len(measure) > 1:
        warnings.append(f"{len(measure)} '{MEASURE_RANGE}' ranges in the capture: kernels of all of them are kept")
    if open_count:
        warnings.append(f"{open_count} NVTX push/pop range(s) never ended (still open when the capture stopped)")
    launches = _launch_subquery(schema)

    kernels: list[TraceKernel] = []
    if not schema.has(cfg["kernel"]["table"]):
        warnings.append(f"no {cfg['kernel']['table']} table: the capture recorded no kernels")
    else:
        kernels = _read_kernels(schema, launches, windows, by_thread, measure, warnings)

    memcpy_count, memcpy_bytes = _count_in_window(schema, "memcpy", launches, windows)
    memset_count, _ = _count_in_window(schema, "memset", launches, windows)
    sync_table = cfg["synchronization"]["table"]
    sync_count = schema.conn.execute(f"SELECT COUNT(*) FROM {_q(sync_table)}").fetchone()[0] if schema.has(
        sync_table
    ) else 0
    return NsysCapture(
        kernels=kernels,
        memcpy_count=memcpy_count,
        memset_count=memset_count,
        memcpy_bytes=memcpy_bytes,
        sync_count=sync_count,
        window_start_ns=windows.starts[0] if windows else None,
        window_end_ns=None if not windows or windows.ends[-1] == _OPEN_END else windows.ends[-1],
        nvtx_range_count=nvtx_count,
        warnings=warnings,
    )


def _read_kernels(
    schema: _Schema,
    launches: str | None,
    windows: _Windows,
    by_thread: dict[int, list[_Range]],
    measure: list[tuple[int, int, int]],
    warnings: list[str],
) -> list[TraceKernel]:
    """Window kernels in launch order, each with the NVTX ranges enclosing its launch call on its thread.

    Consumes `by_thread`.
    """
    sweeps = {thread: _ThreadSweep(ranges) for thread, ranges in by_thread.items()}
    by_thread.clear()  # the sweeps own the ranges now and drop each one once it has closed
    measure_threads = {thread for _, _, thread in measure}
    kernels: list[TraceKernel] = []
    outside = unlaunched = foreign = 0
    for row in schema.conn.execute(_kernel_sql(schema, launches)):
        (start, end, device, stream, corr, name, mangled, gx, gy, gz, bx, by, bz, regs, smem, thread, api_start) = row
        if api_start is None:
            unlaunched += 1
        if windows and not windows.contains(api_start if api_start is not None else start):
            outside += 1
            continue
        stack: list[Frame] = []
        if thread is not None and api_start is not None:
            if thread in sweeps:
                stack = sweeps[thread].enclosing(api_start)
            if measure and thread not in measure_threads:
                foreign += 1
        kernels.append(
            TraceKernel(
                ordinal=len(kernels),
                name=name or "",
                mangled_name=mangled,
                start_ns=start,
                duration_ns=end - start,
                device_id=device,
                stream_id=stream,
                correlation_id=corr,
                grid=(gx, gy, gz),
                block=(bx, by, bz),
                registers_per_thread=regs,
                shared_memory_bytes=smem,
                launch_thread=None if thread is None else decode_global_tid(thread)[1],
                launch_start_ns=api_start,
                stack=stack,
            )
        )
    if outside:
        warnings.append(f"{outside} kernel(s) launched outside the '{MEASURE_RANGE}' range were dropped")
    if unlaunched:
        warnings.append(
            f"{unlaunched} kernel(s) have no launching API call in the export: ordered and windowed by GPU start"
        )
    if foreign:
        warnings.append(f"{foreign} window kernel(s) were launched from a thread other than the measure range's")
    return kernels
