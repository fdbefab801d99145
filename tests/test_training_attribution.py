"""Attribution where real workloads live, on runs recorded on an H100 (scripts/record_gpu_fixtures.py, small sizes):
a training step with AdamW in eager and inductor (scripts/gpu_workloads/encoder_train_step.py), a forward that
compiles to three graphs (graph_breaks.py), and a forward launching from two host threads (tests/scripts/
two_threads.py). Expected values are recomputed here from the raw nsys export (SQL), not from the assembler."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
from fixtures_util import extract_fixture, raw_enclosing_ranges, raw_window_kernels

from mcp_server.analysis import analyze_profile
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import SCHEMA_VERSION, OperatorAttributedProfile

REPO = Path(__file__).resolve().parents[1]
MARKER = "autograd::engine::evaluate_function: "
SEQ = re.compile(r", seq = (\d+)")


def _run(archive: str, run: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_fixture(archive, tmp_path_factory) / run


def _fixture(archive: str, run: str) -> object:
    """A module-scoped fixture: the extracted run directory `run` of `tests/fixtures/<archive>.tar.xz`."""

    @pytest.fixture(scope="module")
    def extracted(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return _run(archive, run, tmp_path_factory)

    return extracted


eager = _fixture("h100_encoder_train_step_eager_train", "encoder_train_step_eager_train")
inductor = _fixture("h100_encoder_train_step_inductor_train", "encoder_train_step_inductor_train")
breaks = _fixture("h100_graph_breaks_inductor", "graph_breaks_inductor")
threads = _fixture("h100_two_threads_eager", "two_threads_eager")


def _by_correlation(profile: OperatorAttributedProfile) -> dict[int, tuple[object, object]]:
    return {k.correlation_id: (k, op) for op in profile.operators for k in op.kernels}


def _ranges(conn: sqlite3.Connection) -> list[tuple[int, int, int, str]]:
    """(globalTid, start, end, text) of every push/pop range, by start then end descending."""
    return conn.execute(
        "SELECT n.globalTid, n.start, n.end, COALESCE(n.text, s.value) FROM NVTX_EVENTS n "
        "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59 ORDER BY n.start, n.end DESC"
    ).fetchall()


def _forward_modules(conn: sqlite3.Connection, thread: int) -> dict[int, str | None]:
    """seq -> module of the last forward op range that started with it on `thread` (the node-creating op)."""
    found: dict[int, str | None] = {}
    for tid, start, _, text in _ranges(conn):
        seq = SEQ.search(text)
        if tid == thread and seq and "::" in text.split(",")[0]:
            modules = [t for _, _, t in raw_enclosing_ranges(conn, thread, start) if t.startswith("module:")]
            found[int(seq.group(1))] = modules[-1].removeprefix("module:") if modules else None
    return found


def test_backward_kernels_carry_the_module_of_the_forward_op_they_differentiate(eager):
    db = eager / "nsys" / "report.sqlite"
    profile = assemble(RunDir(eager))
    raw = raw_window_kernels(db)
    forward_thread = raw[0].global_tid
    known = _by_correlation(profile)
    total = matched = 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        modules = _forward_modules(conn, forward_thread)
        ranges = _ranges(conn)
        for k in raw:
            stack = raw_enclosing_ranges(conn, k.global_tid, k.api_start)
            marker = next(((s, e, t) for s, e, t in stack if t.startswith(MARKER)), None)
            if marker is None:
                continue
            total += k.end - k.start
            node = marker[2].removeprefix(MARKER).split(",")[0]
            seq = next((int(m.group(1)) for tid, s, e, t in ranges if tid == k.global_tid and marker[0] <= s
                        and e <= marker[1] and t.split(",")[0] == node and (m := SEQ.search(t))), None)
            kernel, op = known[k.correlation_id]
            assert kernel.phase == op.phase == "backward" and op.autograd_node == node
            if seq is not None and modules.get(seq) and op.module_path == modules[seq]:
                matched += k.end - k.start
    assert total > 0.5 * sum(k.end - k.start for k in raw), "the backward is most of a training step"
    assert matched / total >= 0.95, f"{100 * matched / total:.1f} % of backward kernel time has its forward's module"


def test_a_training_step_has_three_phases_and_its_optimizer_updates_the_model(eager):
    profile = assemble(RunDir(eager))
    phases = profile.window.kernel_time_by_phase_ns
    assert set(phases) == {"forward", "backward", "optimizer"}
    assert sum(phases.values()) == profile.window.kernel_time_ns
    optimizer = [op for op in profile.operators if op.phase == "optimizer"]
    assert optimizer and all(op.operator_name.startswith("aten::_foreach_") for op in optimizer)
    assert {op.module_path for op in optimizer} == {"Encoder"} == {profile.capture_metadata.root_module}
    assert profile.window.module_path_kernel_time_pct >= 95.0
    assert not any(w.startswith("module paths cover") for w in profile.warnings)
    assert profile.schema_version == SCHEMA_VERSION


def test_eager_kernel_time_has_call_sites_in_the_workload_file(eager):
    db = eager / "nsys" / "report.sqlite"
    profile = assemble(RunDir(eager))
    raw = raw_window_kernels(db)
    source = (REPO / "scripts" / "gpu_workloads" / "encoder_train_step.py").read_text().splitlines()
    known = _by_correlation(profile)
    in_file = 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for k in raw:
            _, op = known[k.correlation_id]
            site = op.call_site or ""
            path, _, line = site.rpartition(":")
            if path.endswith("encoder_train_step.py") and source[int(line) - 1].strip():
                in_file += k.end - k.start
            sites = [t for _, _, t in raw_enclosing_ranges(conn, k.global_tid, k.api_start) if t.startswith("site:")]
            if op.phase != "backward":  # a backward call's site is its forward op's
                assert site == sites[-1].removeprefix("site:")
    assert in_file / sum(k.end - k.start for k in raw) >= 0.90
    lines = {source[int(op.call_site.rpartition(":")[2]) - 1].strip() for op in profile.operators}
    assert "optimizer.step()" in lines and "return self.head(self.layers(x))" in lines


def test_compiled_backward_kernels_carry_module_paths(inductor):
    profile = assemble(RunDir(inductor))
    modules = set(json.loads((inductor / "nsys" / "harness.json").read_text())["modules"]) | {"Encoder"}
    backward = [op for op in profile.operators if op.phase == "backward"]
    total = sum(op.aggregated.total_duration_ns for op in backward)
    placed = sum(op.aggregated.total_duration_ns for op in backward
                 if op.module_path and set(op.module_path.split(",")) <= modules)
    assert placed / total >= 0.95
    attention = [op for op in backward if "attention_backward" in op.operator_name]
    assert len(attention) == 4 and sorted(op.module_path for op in attention) == [
        f"layers.layers.{i}.self_attn" for i in range(4)]
    assert all(op.compiled_graph for op in backward if op.autograd_node == "CompiledFunctionBackward")
    assert profile.window.module_path_kernel_time_pct >= 95.0


def test_each_graph_s_gemm_carries_its_own_linear_and_the_breaks_are_listed_with_their_lines(breaks):
    db = breaks / "nsys" / "report.sqlite"
    profile = assemble(RunDir(breaks))
    known = _by_correlation(profile)
    expected = {"0": "first.0", "1": "second.0", "2": "third.0"}  # Dynamo frame i: the code after the i-th break
    gemms = 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for k in raw_window_kernels(db):
            _, op = known[k.correlation_id]
            if op.operator_name != "aten::mm":
                continue
            # a resumed frame runs inside the one that broke: the innermost region is the kernel's graph
            region = [t for _, _, t in raw_enclosing_ranges(conn, k.global_tid, k.api_start)
                      if t.startswith("Torch-Compiled Region: ")][-1]
            frame = region.removeprefix("Torch-Compiled Region: ").split("/")[0]
            assert op.module_path == expected[frame], region
            gemms += 1
    assert gemms == 3
    source = (REPO / "scripts" / "gpu_workloads" / "graph_breaks.py").read_text().splitlines()
    listed = profile.capture_metadata.graph_breaks
    assert [Path(b.location.rpartition(":")[0]).name for b in listed] == ["graph_breaks.py"] * 2
    lines = [source[int(b.location.rpartition(":")[2]) - 1] for b in listed]
    assert ".item()" in lines[0] and "print(" in lines[1]
    assert "item()" in listed[0].reason and [b.compile_id for b in listed] == ["0/0", "1/0"]


def test_analyze_ranks_removing_the_graph_breaks(breaks, tmp_path):
    profile = assemble(RunDir(breaks))
    analysis = analyze_profile(profile, tmp_path)
    found = [o for o in analysis.opportunities if o.change_class == "graph_breaks"]
    assert len(found) == 1
    opportunity = found[0]
    assert opportunity.title.startswith("Remove 2 graph break(s)") and "graph_breaks.py:23" in opportunity.title
    assert "compiled_graphs=3" in opportunity.triggers and "graph_boundaries=2" in opportunity.triggers
    assert opportunity.knowledge == "knowledge/fx_patterns/graph_breaks.py"
    assert (REPO / opportunity.knowledge).is_file()
    assert 0 < opportunity.estimated_saving_ns <= analysis.timeline.window_ns


def test_two_host_threads_are_attributed_by_their_own_ranges(threads):
    db = threads / "nsys" / "report.sqlite"
    profile = assemble(RunDir(threads))
    raw = raw_window_kernels(db)
    known = _by_correlation(profile)
    total = sum(k.end - k.start for k in raw)
    attributed = 0
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for k in raw:
            if k.correlation_id not in known:
                continue
            _, op = known[k.correlation_id]
            ops = [t.split(",")[0] for _, _, t in raw_enclosing_ranges(conn, k.global_tid, k.api_start)
                   if t.startswith("aten::")]
            assert op.operator_name == ops[0]  # the outermost operator range on the launching thread
            attributed += k.end - k.start
    assert len({k.global_tid for k in raw}) == 3
    assert attributed / total >= 0.995
    assert profile.window.attributed_kernel_time_pct >= 99.5


def test_training_step_modules_by_phase_in_summary_and_analysis(eager, tmp_path):
    from mcp_server.queries import modules_by_phase

    profile = assemble(RunDir(eager))
    rows = modules_by_phase(profile, limit=100)
    attention = {r.phase: r.kernel_time_ns for r in rows if r.module_path == "layers.layers.2.self_attn"}
    assert set(attention) == {"forward", "backward"} and attention["backward"] > attention["forward"]
    assert sum(r.kernel_time_ns for r in rows) == profile.window.kernel_time_ns
    stages = analyze_profile(profile, tmp_path).stages
    assert any(s.label == "layers.layers.2.self_attn (backward)" and s.phase == "backward" for s in stages)


@pytest.mark.parametrize("archive,run", [
    ("h100_encoder_train_step_eager_train", "encoder_train_step_eager_train_torch"),
    ("h100_encoder_train_step_inductor_train", "encoder_train_step_inductor_train_torch"),
])
def test_the_torch_profiler_pass_attributes_the_training_step_alike(archive, run, tmp_path_factory):
    """The same step under torch.profiler (Kineto's sequence numbers and ranges) attributes as the nsys pass."""
    profile = assemble(RunDir(_run(archive, run, tmp_path_factory)))
    trace = json.loads((_run(archive, run, tmp_path_factory) / "torch" / "kineto_trace.json").read_text())
    raw_total = sum(round(e["dur"] * 1000) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    assert profile.window.kernel_time_ns == pytest.approx(raw_total, abs=len(profile.operators) * 1000)
    assert set(profile.window.kernel_time_by_phase_ns) == {"forward", "backward", "optimizer"}
    assert profile.window.module_path_kernel_time_pct >= 95.0
    backward = [op for op in profile.operators if op.phase == "backward"]
    with_module = sum(op.aggregated.total_duration_ns for op in backward if op.module_path)
    assert with_module / sum(op.aggregated.total_duration_ns for op in backward) >= 0.95
    if "eager" in run:
        assert profile.window.call_site_kernel_time_pct >= 90.0
        assert all(op.call_site.rpartition(":")[0].endswith("encoder_train_step.py") for op in profile.operators)
