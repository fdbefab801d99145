"""The window's host synchronisations and memory copies and sets from an nsys SQLite export, as `RuntimeCall`s.

The CUDA API calls (runtime and driver tables) whose names `tables.yaml` lists as synchronising, copying or
setting are read with their host times and launching thread; each copy or set is joined, by correlation id, to
its GPU activity row (bytes, direction, pageable or pinned memory), and each call to CUPTI's synchronisation
record where there is one (stream, event or context wait). Only calls that start inside the measure range are
kept. The NVTX ranges enclosing each call on its thread come from one sweep over the ranges, as for kernels.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mcp_server.schema.records import RuntimeCall
from plugins.cuda_api import kind_of, synchronizing
from plugins.nsys.ranges import RangeFeed
from plugins.nsys.sql import Schema, Strings, decode_global_tid, quote, tables


def bare_api(name: str) -> str:
    """An API's name without nsys's version suffix (`cudaStreamSynchronize_v3020` -> `cudaStreamSynchronize`)."""
    return re.sub(tables()["runtime_api"]["version_suffix"], "", name)


def read_runtime_calls(schema: Schema, ranges: Callable[[], RangeFeed], contains: Any) -> list[RuntimeCall]:
    """The window's synchronising, copying and setting API calls in call order; `contains(t)` says whether host time
    `t` lies in the window; `ranges()` opens the sweep over the NVTX ranges enclosing each call (only when there is
    a call to place)."""
    cfg, spec = tables(), tables()["runtime_api"]
    strings = Strings(schema)
    rows: list[tuple[int, int, int, int, str]] = []
    for table in spec["tables"]:
        if not schema.has(table) or spec["name_id"] not in schema.columns(table):
            continue
        schema.require(table, spec["start"], spec["end"], spec["thread"], spec["correlation_id"])
        ids = [i for (i,) in schema.conn.execute(f"SELECT DISTINCT {quote(spec['name_id'])} FROM {quote(table)}")]
        wanted = {i: api for i in ids if (api := bare_api(strings[i] or "")) and kind_of(api) is not None}
        if not wanted:
            continue
        marks = ", ".join("?" * len(wanted))
        sql = (f"SELECT {quote(spec['start'])}, {quote(spec['end'])}, {quote(spec['thread'])}, "
               f"{quote(spec['correlation_id'])}, {quote(spec['name_id'])} FROM {quote(table)} "
               f"WHERE {quote(spec['name_id'])} IN ({marks})")
        rows += [(s, e, t, c, wanted[n]) for s, e, t, c, n in schema.conn.execute(sql, tuple(wanted))
                 if contains(s)]
    rows.sort(key=lambda r: (r[0], r[3]))
    if not rows:
        return []
    feed = ranges()
    copies = _activity(schema, cfg["memcpy"], ("bytes", "copy_kind", "src_kind", "dst_kind"))
    sets = _activity(schema, cfg["memset"], ("bytes", "mem_kind"))
    waits = _activity(schema, cfg["synchronization"], ("sync_type",))
    kinds, memory, sync_types = cfg["copy_kinds"], cfg["memory_kinds"], cfg["sync_types"]
    calls = []
    for ordinal, (start, end, thread, corr, api) in enumerate(rows):
        kind = kind_of(api)
        assert kind is not None
        call = RuntimeCall(ordinal=ordinal, kind=kind, api=api, api_start_ns=start, api_end_ns=end,
                           thread=decode_global_tid(thread)[1] if thread is not None else None, correlation_id=corr,
                           stack=[r.as_frame() for r in feed.enclosing(thread, start)] if thread is not None else [])
        if kind == "memcpy" and corr in copies:
            gpu_start, gpu_end, size, copy_kind, src, dst = copies[corr]
            call.gpu_start_ns, call.gpu_end_ns, call.bytes = gpu_start, gpu_end, size
            call.copy_kind, call.src_memory, call.dst_memory = kinds.get(copy_kind), memory.get(src), memory.get(dst)
        elif kind == "memset" and corr in sets:
            gpu_start, gpu_end, size, mem_kind = sets[corr]
            call.gpu_start_ns, call.gpu_end_ns, call.bytes, call.dst_memory = gpu_start, gpu_end, size, \
                memory.get(mem_kind)
        if corr in waits:
            call.sync_type = sync_types.get(waits[corr][2])
        call.synchronizing = synchronizing(api, call.copy_kind, call.src_memory, call.dst_memory)
        calls.append(call)
    return calls


def _activity(schema: Schema, spec: dict[str, Any], columns: tuple[str, ...]) -> dict[int, tuple[Any, ...]]:
    """(start, end, *columns) of an activity table's rows by correlation id (empty when the table is absent); a
    descriptive column the export lacks (an older nsys) reads as NULL."""
    if not schema.has(spec["table"]):
        return {}
    schema.require(spec["table"], spec["correlation_id"], spec["start"], spec["end"])
    present = schema.columns(spec["table"])
    names = [quote(spec["start"]), quote(spec["end"]),
             *(quote(spec[c]) if spec[c] in present else "NULL" for c in columns)]
    sql = f"SELECT {quote(spec['correlation_id'])}, {', '.join(names)} FROM {quote(spec['table'])}"
    return {row[0]: row[1:] for row in schema.conn.execute(sql)}
