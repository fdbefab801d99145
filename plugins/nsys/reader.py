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
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field

from mcp_server.children.contract import MEASURE_RANGE
from mcp_server.schema.records import RuntimeCall, TraceKernel
from plugins.bulk import gc_paused
from plugins.nsys.activity import read_runtime_calls
from plugins.nsys.graphs import CapturePoint, capture_points, capture_stacks
from plugins.nsys.host_compute import HostCall, cuda_call_starts, host_calls
from plugins.nsys.ranges import NvtxRange, RangeFeed, RangesOutOfOrder, Windows
from plugins.nsys.sql import (
    OPEN_END,
    NsysExportError,
    NvtxSql,
    Schema,
    Strings,
    decode_global_tid,
    kernel_sql,
    launch_subquery,
    quote,
    tables,
)
from plugins.nvtx_names import GRAPH_CALL_PREFIX, classify_text, parse_seq
from plugins.sequences import BACKWARD_PREFIX, RangeRow, SequenceIndex, forward_origins

T = TypeVar("T")


class NsysCapture(BaseModel):
    """What an nsys capture holds about the measured window."""

    kernels: list[TraceKernel] = Field(default_factory=list, description="Window kernels in launch order.")
    memcpy_count: int = Field(default=0, description="Memory copies launched inside the window.")
    memset_count: int = Field(default=0, description="Memory sets launched inside the window.")
    memcpy_bytes: int = Field(default=0, description="Bytes moved by the window's memory copies.")
    sync_count: int = Field(default=0, description="CUPTI synchronization records in the whole capture.")
    runtime_calls: list[RuntimeCall] = Field(
        default_factory=list, description="The window's synchronising, copying and setting CUDA API calls.")
    window_start_ns: int | None = Field(default=None, description="Start of the measure NVTX range, ns.")
    window_end_ns: int | None = Field(default=None, description="End of the measure NVTX range, ns.")
    nvtx_range_count: int = Field(default=0, description="NVTX push/pop ranges in the whole capture.")
    warnings: list[str] = Field(default_factory=list)


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
    from_graph: bool = False  # replayed from a CUDA graph: launched by cudaGraphLaunch, not by its own call

    def trace_kernel(self) -> TraceKernel:
        """The pydantic record `read_nsys_sqlite` returns."""
        return TraceKernel(
            ordinal=self.ordinal, name=self.name, mangled_name=self.mangled_name, start_ns=self.start_ns,
            duration_ns=self.duration_ns, device_id=self.device_id, stream_id=self.stream_id,
            correlation_id=self.correlation_id, grid=self.grid, block=self.block,
            registers_per_thread=self.registers_per_thread, shared_memory_bytes=self.shared_memory_bytes,
            launch_thread=self.launch_thread, launch_start_ns=self.launch_start_ns,
            stack=[r.as_frame() for r in self.stack], from_graph=self.from_graph,
        )


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

    def _session_start(self) -> int | None:
        """When the session started, ns since the UNIX epoch (nsys's timestamps count from it): the clock that
        lines up the reports of several processes."""
        if not self.schema.has("TARGET_INFO_SESSION_START_TIME"):
            return None
        row = self.conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def _open(self) -> None:
        cfg = tables()
        self.schema = schema = Schema(self.conn)
        if not schema.has(cfg["strings"]["table"]):
            raise NsysExportError(f"{self.path} has no {cfg['strings']['table']} table: not an nsys SQLite export")
        self.nvtx = NvtxSql(schema)
        self.measure = self.nvtx.measure_ranges() if self.nvtx.present else []
        self.windows = Windows(self.measure)
        self.window_start_ns = self.windows.starts[0] if self.windows else None
        self.session_start_utc_ns = self._session_start()
        self.window_end_ns = None if not self.windows or self.windows.ends[-1] == OPEN_END else self.windows.ends[-1]
        self.launches = launch_subquery(schema)
        self.has_kernels = schema.has(cfg["kernel"]["table"])
        self.kernel_sql: str | None = None
        if self.has_kernels:
            kernel = cfg["kernel"]
            corrs = f"SELECT {quote(kernel['correlation_id'])} FROM {quote(kernel['table'])}"
            self.kernel_sql = kernel_sql(schema, launch_subquery(schema, corrs) if self.launches else None)
        self.graph_points = capture_points(schema, Strings(schema)) if self.nvtx.present else {}
        self.harness_captures = False  # the harness recorded the captures of the graphs replayed in the window
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
            strings = Strings(self.schema)
            cursor, check_order = self.nvtx.ranges(self.table_order) if self.nvtx.present else (None, False)
            feed = RangeFeed(cursor, strings, check_order)
            captured: dict[CapturePoint, tuple[NvtxRange, ...]] = {}
            if self.graph_points:  # a second sweep, over the ranges open as the workload captured its graphs
                graph_cursor, graph_check = self.nvtx.ranges(self.table_order)
                captured = capture_stacks(self.graph_points, RangeFeed(graph_cursor, strings, graph_check))
            self.harness_captures = bool(captured)
            if self.kernel_sql is not None:
                yield from self._stream(feed, strings, self.kernel_sql, captured)
            feed.drain()
            self.nvtx_range_count, self._open_count = feed.count, feed.open_count

    def _stream(self, feed: RangeFeed, strings: Strings, sql: str,
                captured: dict[CapturePoint, tuple[NvtxRange, ...]]) -> Iterator[WindowKernel]:
        starts, ends = self.windows.starts, self.windows.ends  # the window test, inlined: a million calls
        names = strings.values
        shapes: dict[tuple[int, int, int], tuple[int, int, int]] = {}
        threads: dict[int, int] = {}
        ordinal = outside = unlaunched = replayed = uncaptured = unranged = 0
        points = self.graph_points
        merged: dict[tuple[int, int], tuple[tuple[NvtxRange, ...], ...]] = {}
        for row in self.conn.execute(sql):
            (start, end, device, stream, corr, name, mangled, gx, gy, gz, bx, by, bz, regs, smem, thread, api_start,
             graph_node) = row
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
                if graph_node is not None and points:  # replayed from a graph: the ranges of its capture
                    point = points.get(graph_node)
                    if point is not None and point in captured:
                        stack, replayed = _replayed_stack(stack, captured[point], merged), replayed + 1
                    elif self.harness_captures and point is None:
                        uncaptured += 1
                    elif self.harness_captures:
                        unranged += 1
                tid = threads.get(thread)
                if tid is None:
                    tid = threads[thread] = decode_global_tid(thread)[1]
            grid, block = (gx, gy, gz), (bx, by, bz)
            yield WindowKernel(
                ordinal, (names[name] if name in names else strings[name]) or "",
                names[mangled] if mangled in names else strings[mangled], start, end - start, device, stream, corr,
                shapes.setdefault(grid, grid), shapes.setdefault(block, block), regs, smem, tid, api_start, stack,
                from_graph=graph_node is not None,
            )
            ordinal += 1
        if outside:
            why = (" (the warm-up and graph captures, traced so that each replay takes its capture's ranges)"
                   if self.harness_captures else "")
            self._warnings.append(f"{outside} kernel(s) launched outside the '{MEASURE_RANGE}' range were dropped{why}")
        if unlaunched:
            self._warnings.append(
                f"{unlaunched} kernel(s) have no launching API call in the export: ordered and windowed by GPU start"
            )
        if replayed:
            self._warnings.append(
                f"{replayed} window kernel(s) were replayed from CUDA graphs the workload captured: each takes the "
                "ranges open when its graph node was captured (its operator, module and call site then)"
            )
        if unranged:
            self._warnings.append(
                f"{unranged} window kernel(s) were replayed from graph nodes captured outside every operator range (a "
                "compiled graph's generated kernels, or a capture the harness did not make): they keep the graph "
                "launch's ranges"
            )
        if uncaptured:
            self._warnings.append(
                f"{uncaptured} window kernel(s) were replayed from CUDA graphs whose capture the timeline does not "
                "hold: they keep the graph launch's ranges"
            )

    def sequence_index(self) -> SequenceIndex:
        """Forward ops and backward nodes by autograd sequence number: one sweep over every NVTX range (see
        `plugins.sequences`); thread ids as `WindowKernel.launch_thread` gives them."""
        if not self.nvtx.present:
            return SequenceIndex({}, {}, {})
        with self._sqlite_errors():
            strings = Strings(self.schema)
            cursor, _ = self.nvtx.ranges(False)
            tids: dict[int, int] = {}

            def rows() -> Iterator[RangeRow]:
                for start, end, thread, text, text_id in cursor:
                    if text is None:
                        text = strings[text_id] or ""
                    name, kind = classify_text(text)
                    seq = parse_seq(text) if kind in ("op", "annotation") else None
                    if kind == "annotation" and seq is None and not name.startswith(BACKWARD_PREFIX):
                        continue  # neither an operator, a module, a call site nor backward work
                    tid = tids.get(thread)
                    if tid is None:
                        tid = tids[thread] = decode_global_tid(thread)[1]
                    yield RangeRow(tid, start, OPEN_END if end is None else end, name, kind, seq)

            return forward_origins(rows())

    def host_calls(self) -> list[HostCall]:
        """The operator calls of the window that the host computed itself (`plugins.nsys.host_compute`)."""
        if not self.nvtx.present or not self.windows:
            return []
        with self._sqlite_errors():
            first, last = self.windows.starts[0], self.windows.ends[-1]
            calls = cuda_call_starts(self.schema, first, last)
            cursor, _ = self.nvtx.ranges(False)
            return host_calls(cursor, Strings(self.schema), {t for _, _, t in self.measure}, self.windows.contains,
                              calls)

    @property
    def forward_threads(self) -> list[int]:
        """The threads of the measure range (as launch threads): where the forward pass runs."""
        return sorted({decode_global_tid(thread)[1] for _, _, thread in self.measure})

    def check_activity_tables(self) -> None:
        """Raise NsysExportError where `activity_counts` would, without counting (assembly does not need counts)."""
        for key in ("memcpy", "memset"):
            spec = tables()[key]
            if self.schema.has(spec["table"]):
                self.schema.require(
                    spec["table"], spec["start"], spec["correlation_id"], *([spec["bytes"]] if "bytes" in spec else [])
                )

    def runtime_calls(self) -> list[RuntimeCall]:
        """The window's host synchronisations and memory copies and sets, in call order, with their NVTX stacks
        (`plugins.nsys.activity`): a sweep of its own over the ranges."""
        def ranges() -> RangeFeed:
            cursor, check_order = self.nvtx.ranges(self.table_order) if self.nvtx.present else (None, False)
            return RangeFeed(cursor, Strings(self.schema), check_order)

        with self._sqlite_errors():
            windows = self.windows
            return read_runtime_calls(self.schema, ranges, lambda t: not windows or windows.contains(t))

    def activity_counts(self) -> tuple[int, int, int, int]:
        """(memcpy count, memcpy bytes, memset count, synchronization records) of the window / capture."""
        with self._sqlite_errors():
            memcpy_count, memcpy_bytes = self._count_in_window("memcpy")
            memset_count, _ = self._count_in_window("memset")
            sync_table = tables()["synchronization"]["table"]
            sync_count = (
                self.conn.execute(f"SELECT COUNT(*) FROM {quote(sync_table)}").fetchone()[0]
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
        bytes_sql = f"m.{quote(spec['bytes'])}" if "bytes" in spec else "0"
        corr = quote(spec["correlation_id"])
        launches = launch_subquery(schema, f"SELECT {corr} FROM {quote(spec['table'])}") if self.launches else None
        if launches:
            sql = (
                f"SELECT COALESCE(l.api_start, m.{quote(spec['start'])}), {bytes_sql} FROM {quote(spec['table'])} m "
                f"LEFT JOIN ({launches}) l ON l.corr = m.{corr}"
            )
        else:
            sql = f"SELECT m.{quote(spec['start'])}, {bytes_sql} FROM {quote(spec['table'])} m"
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
    runtime_calls = window.runtime_calls()
    return NsysCapture(
        kernels=kernels,
        memcpy_count=memcpy_count,
        memset_count=memset_count,
        memcpy_bytes=memcpy_bytes,
        sync_count=sync_count,
        runtime_calls=runtime_calls,
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
    except RangesOutOfOrder:
        pass
    with NsysWindow(path, table_order=False) as window:
        return consume(window)


def _replayed_stack(launch: tuple[NvtxRange, ...], capture: tuple[NvtxRange, ...],
                    merged: dict[tuple[int, int], tuple[tuple[NvtxRange, ...], ...]]) -> tuple[NvtxRange, ...]:
    """The stack of a kernel a CUDA graph replayed: the ranges open at its node's capture, inside the compiled
    graph's call range open at the replay. A graph that CUDA-graph trees captured (`mode="reduce-overhead"`) was
    captured inside that call, but its range began before the capture turned the ranges on: the replay's call range
    names the generated code whose call sites place its library kernels. A replay inside the autograd engine's
    marker is backward work wherever its nodes were captured (a training step's backward graph, captured on the
    engine's thread before the ranges recorded it): the replay's marker stays outermost. One tuple per (launch,
    capture) pair, as `RangeFeed.enclosing` returns one per unchanged stack."""
    key = (id(launch), id(capture))
    known = merged.get(key)
    if known is None or known[0] is not launch or known[1] is not capture:
        calls = tuple(f for f in launch if f.name.startswith(GRAPH_CALL_PREFIX))
        inside = calls and not any(f.name.startswith(GRAPH_CALL_PREFIX) for f in capture)
        backward = () if any(f.name.startswith(BACKWARD_PREFIX) for f in capture) else \
            tuple(f for f in launch if f.name.startswith(BACKWARD_PREFIX))[:1]
        known = merged[key] = (launch, capture, backward + (calls if inside else ()) + capture)
    return known[2]


__all__ = [
    "NsysCapture", "NsysExportError", "NsysWindow", "WindowKernel", "decode_global_tid", "read_nsys_sqlite",
    "read_window", "tables",
]
