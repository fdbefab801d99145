"""A compiled pass loads a graph AOTAutograd's cache holds whole (no tracing, no graph passes), keeping the module
paths recorded when it was traced: the node records the tracing pass left beside Inductor's cache. Without them
the graph is traced again."""

from __future__ import annotations

import json

from conftest import REPO

from mcp_server.capture.passes import run_pass
from mcp_server.capture.request import CaptureRequest, WorkloadOptions
from mcp_server.children.inductor_cache import GRAPH_RECORDS
from mcp_server.rundir import RunDir

WORKLOAD = REPO / "tests" / "workloads" / "tiny_train.py"


def _pass(run_dir, name: str = "timing") -> tuple[dict, dict]:
    """One harness pass of the workload's training step under Inductor: its result and its provenance."""
    req = CaptureRequest(workload=WORKLOAD, run_dir=RunDir(run_dir),
                         options=WorkloadOptions(compile_mode="inductor", warmup_iters=1, train_step=True))
    _, result = run_pass(req, name, "none")
    assert result is not None and result.ok, result and result.error
    result = result.model_dump()
    provenance = json.loads((run_dir / name / "inductor_provenance.json").read_text())
    return result, provenance


def _compiled(provenance: dict) -> list[tuple[str, str, dict]]:
    """Each compiled AOT graph: its kind, FX-graph-cache key and module map."""
    return [(g["kind"], g["fx_graph_cache_key"], g["node_modules"]) for g in provenance["graphs"]
            if g["kind"] != "dynamo"]


def test_a_graph_from_aotautograds_cache_keeps_the_module_paths_it_was_traced_with(tmp_path, monkeypatch):
    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    traced, first = _pass(tmp_path / "first")
    assert traced["graphs_from_aot_cache"] == 0
    kinds = [kind for kind, _, _ in _compiled(first)]
    assert kinds == ["forward", "backward"]
    assert any(v["module_path"].startswith("layers") for _, _, nodes in _compiled(first) for v in nodes.values())
    (scope,) = (cache / GRAPH_RECORDS).iterdir()  # the Dynamo graph's folder: a record per compiled graph
    records = sorted(p.name for p in scope.iterdir())
    assert len(records) == 2

    loaded, second = _pass(tmp_path / "second")
    assert loaded["graphs_from_aot_cache"] == 1, "the Dynamo graph came whole from AOTAutograd's cache"
    assert _compiled(second) == _compiled(first)
    code = [(tmp_path / run / "timing" / g["code"]).read_text() for run, p in (("first", first), ("second", second))
            for g in p["graphs"] if g["kind"] == "forward"]
    assert code[0] == code[1], "the generated code is the cached graph's"

    backward = next(scope / f"{key}.json" for kind, key, _ in _compiled(first) if kind == "backward")
    backward.rename(scope / "another-graph.json")
    partly, third = _pass(tmp_path / "third")
    assert partly["graphs_from_aot_cache"] == 0, "a cached graph without its record is traced again"
    assert [kind for kind, _, _ in _compiled(third)] == ["forward", "backward"]
    assert all(nodes for _, _, nodes in _compiled(third))
    assert backward.is_file(), "and its record saved"

    for record in scope.iterdir():
        record.unlink()
    again, fourth = _pass(tmp_path / "fourth")
    assert again["graphs_from_aot_cache"] == 0, "with no node records at all the graph is traced again"
    for (kind, key, nodes), (kind_then, key_then, nodes_then) in zip(_compiled(fourth), _compiled(first),
                                                                     strict=True):
        assert (kind, key) == (kind_then, key_then), "from the graph as Dynamo handed it over: the same graphs"
        # Inductor's cache served them, so the nodes its post-grad passes make (on a GPU) were not seen again
        assert nodes and nodes.items() <= nodes_then.items()
    assert sorted(p.name for p in scope.iterdir()) == records, "and its records saved again"
