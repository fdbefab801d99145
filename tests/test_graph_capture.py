"""Kernels replayed from a CUDA graph the workload captured itself take the operators and modules open when their
graph nodes were captured (nsys's per-node graph trace). A tiny export in the nsys 2025.3 schema, built inline: no
recording of this path exists yet."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mcp_server.assemble.attribute import CAPTURED_DETAIL, attribute_kernels
from mcp_server.assemble.provenance import Provenance
from mcp_server.backends.registry import REGISTRY
from mcp_server.capture.plan import plan_passes
from mcp_server.children.contract import GRAPH_CAPTURE_RANGE, MEASURE_RANGE
from plugins.nsys.reader import read_nsys_sqlite

T = (7 << 24) | 8
_SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
  correlationId INTEGER, demangledName INTEGER, shortName INTEGER, mangledName INTEGER, registersPerThread INTEGER,
  gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
  staticSharedMemory INTEGER, dynamicSharedMemory INTEGER, graphNodeId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER,
  nameId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
  textId INTEGER, domainId INTEGER);
CREATE TABLE CUDA_GRAPH_NODE_EVENTS (start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER,
  nameId INTEGER, graphNodeId INTEGER, originalGraphNodeId INTEGER);
"""


def _export(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA)
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [
        (1, "gemm"), (2, "relu_kernel"), (3, "cudaGraphLaunch_v10000"), (4, "Graph Node Creation"), (5, "other")])
    conn.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, NULL, 0)", [
        # the workload's capture, in the harness's ranges (warm-up, before the window)
        (1000, 2000, GRAPH_CAPTURE_RANGE, T),
        (1100, 1900, "module:encoder", T),
        (1200, 1400, "aten::linear, op_id = 1, sizes = [[4, 8], [16, 8], [16]]", T),
        (1210, 1390, "aten::addmm, op_id = 2, sizes = [[16], [4, 8], [8, 16]]", T),
        (1500, 1600, "aten::relu, op_id = 3, sizes = [[4, 16]]", T),
        (1450, 1650, "site:/w/model.py:12", T),
        # a capture the harness did not open its ranges around (Inductor's own graphs are placed otherwise)
        (2900, 3100, "aten::mul, op_id = 4, sizes = [[4]]", T),
        # the window: the graph launched from the workload's forward
        (5000, 9000, MEASURE_RANGE, T),
        (5050, 8000, "module:Wrapper", T),
    ])
    conn.executemany("INSERT INTO CUDA_GRAPH_NODE_EVENTS VALUES (?, ?, 0, ?, 4, ?, ?)", [
        (1250, 1251, T, 11, None), (1550, 1551, T, 12, None),  # created while captured
        (2500, 2501, T, 21, 11), (2501, 2502, T, 22, 12),  # their clones at instantiation
        (3000, 3001, T, 31, None), (3200, 3201, T, 41, 31),  # the other capture
    ])
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (5100, 5120, ?, 50, 3)", (T,))
    row = "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, 50, ?, ?, ?, 32, 4, 1, 1, 128, 1, 1, 0, 0, ?)"
    conn.executemany(row, [(5200, 5300, 1, 1, 1, 21), (5310, 5330, 2, 2, 2, 22), (5340, 5350, 5, 5, 5, 41),
                           (5360, 5370, 5, 5, 5, 99)])
    conn.commit()
    conn.close()
    return path


def test_replayed_kernels_take_the_ranges_of_their_capture(tmp_path):
    capture = read_nsys_sqlite(_export(tmp_path / "graph.sqlite"))
    stacks = {k.name: [f.name for f in k.stack] for k in capture.kernels}
    assert stacks["gemm"] == [GRAPH_CAPTURE_RANGE, "encoder", "aten::linear", "aten::addmm"]
    assert stacks["relu_kernel"] == [GRAPH_CAPTURE_RANGE, "encoder", "/w/model.py:12", "aten::relu"]
    others = [[f.name for f in k.stack] for k in capture.kernels if k.name == "other"]
    assert others == [[MEASURE_RANGE, "Wrapper"]] * 2, "nodes captured outside the harness's range keep the launch's"
    assert any(w.startswith("2 window kernel(s) were replayed from CUDA graphs the workload captured")
               for w in capture.warnings)
    assert any(w.startswith("1 window kernel(s) were replayed from CUDA graphs whose capture the timeline does not")
               for w in capture.warnings), "node 99 has no creation event"
    assert any(w.startswith("1 window kernel(s) were replayed from graph nodes captured outside every operator range")
               for w in capture.warnings), "node 41 was captured outside the harness's range"
    operators, unattributed = attribute_kernels(capture.kernels, Provenance(), capture.window_start_ns or 0,
                                                high_confidence_links=False)
    assert [(op.operator_name, op.module_path, op.call_site) for op in operators] == [
        ("aten::linear", "encoder", None), ("aten::relu", "encoder", "/w/model.py:12")]
    assert {k.attribution.detail for op in operators for k in op.kernels} == {CAPTURED_DETAIL}
    assert [k.kernel_name for k in unattributed] == ["other", "other"]


def test_only_nsys_records_the_workloads_captures_and_not_inductors():
    def main(backend: str, mode: str):
        return plan_passes(REGISTRY[backend], counters=True, whole_window=True, timing=True,
                           compile_mode=mode,  # type: ignore[arg-type]
                           warmup_iters=3, precompiling=False)

    assert [p.record_graph_capture for p in main("nsys", "eager")] == [False, True, False, False]
    assert next(p for p in main("nsys", "optimized") if p.name == "nsys").record_graph_capture
    assert not any(p.record_graph_capture for p in main("nsys", "cudagraphs") + main("torch", "eager"))
