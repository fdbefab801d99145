"""CUDA graphs a workload captured itself: where each replayed kernel's graph node was captured.

Under `--cuda-graph-trace=node` nsys writes a kernel a graph replays with the id of its node in the executable graph
(a clone made at instantiation), and `CUDA_GRAPH_NODE_EVENTS` records every node's creation: the captured node's on
the capturing thread, at the moment its launch was captured, and each clone's with the node it was cloned from. The
NVTX ranges open on that thread at that moment (the operator, module and call-site ranges of the capture, which the
harness records when the workload captures a graph) say which operator and module made the kernel; a replayed
kernel's own launch is the graph launch, inside no operator.
"""

from __future__ import annotations

from mcp_server.children.contract import GRAPH_CAPTURE_RANGE
from plugins.nsys.ranges import NvtxRange, RangeFeed
from plugins.nsys.sql import Schema, Strings, quote, tables

CapturePoint = tuple[int, int]  # (globalTid, start) of a node's creation during stream capture


def capture_points(schema: Schema, strings: Strings) -> dict[int, CapturePoint]:
    """Every graph node id (clones included) -> where its original node was created: (thread, time)."""
    spec = tables()["graph_nodes"]
    if not schema.has(spec["table"]):
        return {}
    schema.require(spec["table"], spec["start"], spec["thread"], spec["node"])
    columns = schema.columns(spec["table"])
    original = quote(spec["original"]) if spec["original"] in columns else "NULL"
    name = quote(spec["name_id"]) if spec["name_id"] in columns else "NULL"
    sql = (f"SELECT {quote(spec['node'])}, {original}, {quote(spec['thread'])}, {quote(spec['start'])}, {name} "
           f"FROM {quote(spec['table'])}")
    parents: dict[int, int] = {}
    created: dict[int, CapturePoint] = {}
    for node, parent, thread, start, name_id in schema.conn.execute(sql):
        if node is None or (name_id is not None and strings[name_id] != spec["creation"]):
            continue
        if parent:
            parents[node] = parent
        elif thread is not None and start is not None:
            created[node] = (thread, start)
    found = dict(created)
    # A clone made at instantiation has a creation event of its own as well (no original, at instantiation time):
    # its capture point is its original's, so follow the links to the node nothing was cloned from.
    for node in parents:
        seen, current = set(), node
        while current in parents and current not in seen:
            seen.add(current)
            current = parents[current]
        if current in created:
            found[node] = created[current]
    return found


def capture_stacks(points: dict[int, CapturePoint], feed: RangeFeed) -> dict[CapturePoint, tuple[NvtxRange, ...]]:
    """The NVTX ranges open at each capture point the harness recorded (inside its `GRAPH_CAPTURE_RANGE`) under an
    operator range, from one sweep of `feed` in time order. Other captures (Inductor's own CUDA graphs, placed by its
    generated code) and nodes captured outside every operator keep their kernels' launch ranges."""
    stacks = {}
    for thread, start in sorted(set(points.values()), key=lambda p: (p[1], p[0])):
        stack = feed.enclosing(thread, start)
        if any(r.text == GRAPH_CAPTURE_RANGE for r in stack) and any(r.kind == "op" for r in stack):
            stacks[(thread, start)] = stack
    return stacks
