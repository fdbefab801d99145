"""The host's own compute in a window, from an nsys SQLite export: operator calls that launched no kernel, made no
CUDA call and lasted at least `MIN_CALL_NS` (operators on CPU tensors: an embedding's backward, an optimizer's step
over parameters kept on the host, a batch collated in the loop), outermost on their thread, on the measure range's
threads.

One sweep over the NVTX ranges: each outermost operator range (`aten::...` outside every other operator) that
starts in the window is host compute when it lasts at least `MIN_CALL_NS` and no CUDA runtime or driver call of its
thread starts inside it. A shorter one is dispatch, not work: a view of a GPU tensor (`split`, `reshape`) launches
nothing either, and costs the host a few microseconds that cheaper launches do recover. Its
module is the innermost `module:` range around it, else the model an optimizer's step updates (a script's
`STEP_OF_PREFIX` range); its call site the innermost `site:` range.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import NamedTuple

from mcp_server.children.contract import STEP_OF_PREFIX
from plugins.nsys.sql import OPEN_END, Schema, Strings, quote, tables
from plugins.nvtx_names import classify_text

Rows = Iterable[tuple[int, int | None, int, str | None, int | None]]  # (start, end, thread, text, textId)
# An operator call at least this long without a kernel or a CUDA call is the host's work: dispatching one, with its
# NVTX range, costs a few microseconds (views of GPU tensors in a decode loop: 5-25 us a call on an H200's host).
MIN_CALL_NS = 100_000


class HostCall(NamedTuple):
    """One operator call the host computed itself."""

    name: str
    module_path: str | None
    call_site: str | None
    duration_ns: int


def cuda_call_starts(schema: Schema, start: int, end: int) -> dict[int, list[int]]:
    """The start of every CUDA runtime and driver call in [start, end], by thread (nsys's global thread id), sorted."""
    spec = tables()["runtime_api"]
    found: dict[int, list[int]] = defaultdict(list)
    for table in spec["tables"]:
        if not schema.has(table):
            continue
        first, thread = quote(spec["start"]), quote(spec["thread"])
        sql = f"SELECT {first}, {thread} FROM {quote(table)} WHERE {first} BETWEEN ? AND ?"
        for began, tid in schema.conn.execute(sql, (start, end)):
            found[tid].append(began)
    for starts in found.values():
        starts.sort()
    return found


def host_calls(rows: Rows, strings: Strings, threads: set[int], contains: Callable[[int], bool],
               calls: dict[int, list[int]]) -> list[HostCall]:
    """The outermost operator calls on `threads` starting in the window (`contains`) with no CUDA call in them;
    `rows` in start order (end descending on ties), as `NvtxSql.ranges` gives them."""
    stacks: dict[int, list[tuple[int, str, str]]] = defaultdict(list)
    found = []
    for start, end, thread, text, text_id in rows:
        if thread not in threads or not contains(start):
            continue
        stop = OPEN_END if end is None else end
        name, kind = classify_text(text if text is not None else strings[text_id] or "")
        stack = stacks[thread]
        while stack and stack[-1][0] < start:
            stack.pop()
        if (kind == "op" and stop != OPEN_END and stop - start >= MIN_CALL_NS
                and not any(k == "op" for _, _, k in stack)):
            starts = calls.get(thread, [])
            at = bisect_left(starts, start)
            if at == len(starts) or starts[at] > stop:
                module = next((n for _, n, k in reversed(stack) if k == "module"), None) or next(
                    (n[len(STEP_OF_PREFIX):] for _, n, _ in reversed(stack) if n.startswith(STEP_OF_PREFIX)), None)
                site = next((n for _, n, k in reversed(stack) if k == "site"), None)
                found.append(HostCall(name, module, site, stop - start))
        stack.append((stop, name, kind))
    return found
