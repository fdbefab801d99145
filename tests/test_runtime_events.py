"""Host synchronisations and memory copies and sets as events of the window, on runs recorded on an H100 and an H200:
the nsys reader and the Kineto reader, their attribution, their idle cost in the window measured without the
profiler. Expected values are read here with plain SQL and json, not with the readers under test."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from fixtures_util import extract_fixture, resnet50_nsys, run_dir

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from plugins.nsys.reader import read_nsys_sqlite
from plugins.torch_profiler.reader import read_kineto_trace

EVENT_APIS = re.compile(r"^(cuda(Device|Stream|Event)Synchronize|cudaMemcpy\w*|cudaMemset\w*)_v\d+$")


def raw_runtime_calls(db: Path) -> list[tuple[int, int, str, int]]:
    """(start, end, API name, correlation id) of the window's synchronising, copying and setting runtime calls."""
    conn = sqlite3.connect(db)
    (start, end), = conn.execute(
        "SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
        "WHERE n.eventType = 59 AND COALESCE(n.text, s.value) = 'operator_profiler::measure'").fetchall()
    rows = conn.execute("SELECT r.start, r.end, s.value, r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                        "JOIN StringIds s ON s.id = r.nameId ORDER BY r.start").fetchall()
    return [(s, e, name.rsplit("_v", 1)[0], c) for s, e, name, c in rows
            if EVENT_APIS.match(name) and start <= s <= end]


@pytest.fixture(scope="module")
def resnet(tmp_path_factory) -> Path:
    return resnet50_nsys(tmp_path_factory.mktemp("resnet"))


@pytest.fixture(scope="module")
def breaks(tmp_path_factory) -> Path:
    return extract_fixture("h100_graph_breaks_inductor", tmp_path_factory) / "graph_breaks_inductor"


def test_the_nsys_reader_reads_every_sync_and_memset_of_resnet50s_window(resnet):
    raw = raw_runtime_calls(resnet)
    calls = read_nsys_sqlite(resnet).runtime_calls
    assert [(c.api_start_ns, c.api_end_ns, c.api, c.correlation_id) for c in calls] == raw
    assert [c.api for c in calls].count("cudaDeviceSynchronize") == 3
    memsets = [c for c in calls if c.kind == "memset"]
    conn = sqlite3.connect(resnet)
    sizes = dict(conn.execute("SELECT correlationId, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall())
    assert [c.bytes for c in memsets] == [sizes[c.correlation_id] for c in memsets] == [4, 4, 4, 4, 4, 256]
    assert [c.stack[-1].name for c in memsets] == ["aten::cudnn_convolution"] * 5 + ["aten::addmm"]
    assert {c.dst_memory for c in memsets} == {"device"} and not any(c.synchronizing for c in memsets)
    assert all(c.synchronizing and [f.name for f in c.stack] == ["operator_profiler::measure"]
               for c in calls if c.kind == "sync")


def test_an_item_between_compiled_graphs_is_named_with_its_line_and_idle_cost(breaks):
    profile = assemble(RunDir(breaks))
    events = profile.runtime_events
    raw = raw_runtime_calls(breaks / "nsys" / "report.sqlite")
    assert events is not None and [e.api for e in events] == [api for _, _, api, _ in raw] == [
        "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
        "cudaDeviceSynchronize"]
    assert [e.origin for e in events] == ["harness", "workload", "workload", "harness", "harness"]
    copy, sync = events[1], events[2]
    line = "scripts/gpu_workloads/graph_breaks.py:23"  # `scale = x.abs().mean().item()`, a break of Dynamo's
    assert (copy.kind, copy.copy_kind, copy.bytes, copy.src_memory, copy.dst_memory) == ("memcpy", "DtoH", 4,
                                                                                          "device", "pinned")
    for event in (copy, sync):
        assert (event.operator_name, event.launch_op, event.phase) == ("aten::item", "aten::_local_scalar_dense",
                                                                        "forward")
        assert event.call_site is not None and event.call_site.endswith(line)
        assert event.operator_id is None, "the .item() launched no kernel: no operator record to point at"
    assert sync.synchronizing and not copy.synchronizing
    kernels = {k.kernel_id: k for op in profile.operators for k in op.kernels}
    after = min((k for k in kernels.values() if k.start_ns >= sync.start_ns + sync.duration_ns),
                key=lambda k: k.start_ns)
    assert sync.next_kernel_id == after.kernel_id
    reach = max(k.start_ns + k.duration_ns for k in kernels.values() if k.start_ns < after.start_ns)
    assert sync.idle_after_ns == after.start_ns - reach
    assert sync.unprofiled_idle_after_ns == after.unprofiled_gap_ns and after.unprofiled_gap_ns
    assert any("1 synchronising call(s) inside the window" in w for w in profile.warnings)


def test_the_kineto_reader_reads_the_same_item(breaks):
    trace = breaks.parent / "graph_breaks_inductor_torch" / "torch" / "kineto_trace.json"
    calls = read_kineto_trace(trace).runtime_calls
    raw = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "gpu_memcpy"]
    assert len(raw) == 1 and raw[0]["name"] == "Memcpy DtoH (Device -> Pinned)"
    assert [c.api for c in calls] == ["cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize"]
    copy = calls[0]
    assert (copy.bytes, copy.copy_kind, copy.src_memory, copy.dst_memory) == (raw[0]["args"]["bytes"], "DtoH",
                                                                             "device", "pinned")
    assert [f.name for f in copy.stack][-2:] == ["aten::item", "aten::_local_scalar_dense"]
    profile = assemble(RunDir(breaks.parent / "graph_breaks_inductor_torch"))
    item = [e for e in profile.runtime_events or [] if e.origin == "workload"]
    assert [e.api for e in item] == ["cudaMemcpyAsync", "cudaStreamSynchronize"]
    assert all(e.call_site and e.call_site.endswith("graph_breaks.py:23") for e in item)


def test_copies_and_sets_inside_operators_carry_their_operator_id(tmp_path_factory):
    profile = assemble(RunDir(run_dir("gpt2_eager", tmp_path_factory)))
    events = profile.runtime_events or []
    ops = {op.operator_id: op for op in profile.operators}
    assert [e.kind for e in events].count("memset") == 8 and [e.kind for e in events].count("memcpy") == 2
    for event in events:
        if event.kind == "sync":
            assert event.origin == "harness"
            continue
        op = ops[event.operator_id]
        assert op.operator_name == event.operator_name and op.module_path == event.module_path
        assert event.call_site == op.call_site and event.phase == "forward"
    memsets = [e for e in events if e.kind == "memset"]
    assert {e.operator_name for e in memsets} == {"aten::linear"} and {e.launch_op for e in memsets} == {"aten::addmm"}
    assert {e.module_path for e in memsets} >= {"h.0.attn.c_attn", "h.1.mlp.c_proj"}
