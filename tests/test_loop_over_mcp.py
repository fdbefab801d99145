"""The optimization loop driven through the MCP server's tools in the order skills/optimize/SKILL.md names them, on
a workload that is not one of the examples, on the CPU, until loop_status says the loop is complete. loop_status is
also asked where a stage is half done (bench run, but validate has not read bench.json yet: bench, then report) and
once the optimized workload is edited after the loop closed (validate again, the report recomputed).

The files the skill's agents write (the profile copied beside the workload, optimizations.json, the optimized
workload and its test) are written here as the agents are told to; every other file comes from a tool.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO
from mcp import Client

from mcp_server.loop import STAGES, read_state
from mcp_server.schema.optimizations import OptimizationPlan
from mcp_server.serve.app import server

WORKLOADS = REPO / "tests" / "workloads"
SKILL = REPO / "skills" / "optimize" / "SKILL.md"
FAST = {"warmup": 1, "calls": 10, "queued": 10, "blocks": 1, "budget_s": 0.1, "input_sets": 1}


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with Client(server) as client:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result.content
            return result.structured_content or {}

    return anyio.run(go)


def _plan(folder: Path, profile: dict[str, Any]) -> OptimizationPlan:
    """The strategist's plan: one item, its evidence quoted from the profile (plan mode reads it back)."""
    linear = next(op for op in profile["operators"] if op["operator_name"] == "aten::linear")
    return OptimizationPlan.model_validate({
        "workload": str(folder / "tiny_mlp.py"), "baseline_profile": "profile.json", "device_name": "cpu",
        "created_at": "2026-11-26T00:00:00+00:00", "not_proposed": [], "items": [{
            "id": "mul-add-fusion", "rank": 1, "title": "Fuse scale-and-shift into addcmul", "ir_level": "functional",
            "target": {"operator_name": "aten::mul", "module_path": None},
            "evidence": [{"metric": "total_duration_ns", "value": linear["aggregated"]["total_duration_ns"],
                          "unit": "ns", "source": linear["operator_id"]}],
            "rationale": "Two elementwise passes over the hidden activation become one.",
            "expected_gain": {"end_to_end_speedup_low": 1.0, "end_to_end_speedup_high": 1.1,
                              "basis": "one elementwise kernel fewer of a few"},
            "pattern": "knowledge/fx_patterns/conv_bn_fold.py", "pass_name": "fuse_mul_add_to_addcmul"}],
    })


def test_the_skill_walks_the_stage_table_with_tools_the_server_has() -> None:
    """The stages the skill walks through are the engine's stage table, and the tools the test below calls in that
    order are the server's."""
    text = SKILL.read_text(encoding="utf-8")
    assert re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE) == [s.name for s in STAGES]

    async def listed() -> set[str]:
        async with Client(server) as client:
            return {t.name for t in (await client.list_tools()).tools}

    called = {"preflight", "profile", "analyze", "recipes", "report", "validate", "compare", "bench", "loop_status"}
    assert called <= anyio.run(listed)
    assert all(f"`{name}`" in text for name in ("recipes", "compare", "bench", "validate", "report"))


@pytest.mark.slow
def test_a_loop_through_the_mcp_tools_ends_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "tinyloop"
    folder.mkdir()
    for name in ("tiny_mlp.py", "tiny_passes.py"):
        shutil.copy(WORKLOADS / name, folder)
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(tmp_path))
    monkeypatch.setenv("OPERATOR_PROFILER_PYTHON", sys.executable)  # the project's interpreter: this one
    workload = str(folder / "tiny_mlp.py")

    assert "checks" in _call("preflight", {"quick": True})  # 1. preflight
    run = _call("profile", {"workload": workload, "counters": True})  # 2. profile: counters degrade on a CPU
    shutil.copy(run["profile_path"], folder / "profile.json")  # the capture agent's copy
    _call("analyze", {"profile": str(folder / "profile.json"), "output": str(folder)})
    _call("recipes", {"workload": workload, "output": str(folder), "only": ["eager+bf16-autocast"], "seeds": [0],
                      **FAST})  # 3. recipes
    profile = json.loads((folder / "profile.json").read_text())
    plan = _plan(folder, profile)  # 4. propose: the strategist's plan, rendered and checked in plan mode
    (folder / "optimizations.json").write_text(plan.model_dump_json(indent=1))
    _call("report", {"baseline_profile": str(folder / "profile.json"), "analysis": str(folder / "analysis.json"),
                     "optimizations": str(folder / "optimizations.json"), "plan": True, "output": str(folder)})
    for name in ("tiny_mlp_optimized.py", "test_tiny_mlp_optimized.py"):  # 5. implement: the backend engineer
        shutil.copy(WORKLOADS / name, folder)
    implemented = plan.model_copy(update={"items": [plan.items[0].model_copy(update={
        "status": "implemented", "status_reason": "tiny_mlp_optimized.py:21"})]})
    (folder / "optimizations.json").write_text(implemented.model_dump_json(indent=1))
    optimized = str(folder / "tiny_mlp_optimized.py")
    verdict = _call("validate", {"baseline": workload, "optimized": optimized, "seeds": [0],  # 6. validate
                                 "optimizations": str(folder / "optimizations.json"), "output": str(folder)})
    assert verdict["passed"], verdict["failed_checks"]
    again = _call("profile", {"workload": optimized, "compile_mode": "optimized"})  # 7. reprofile
    shutil.copy(again["profile_path"], folder / "profile_optimized.json")
    # 8. compare: in CPU-only profiles the compiled operators carry no module path, a refusal the skill names
    _call("compare", {"baseline": str(folder / "profile.json"), "optimized": str(folder / "profile_optimized.json"),
                      "allow_mismatch": True, "output": str(folder)})
    for mode in ("eager", "free"):  # 9. bench, then validate with bench.json
        _call("bench", {"baseline": workload, "optimized": optimized, "baseline_mode": mode, "tier": "reduced",
                        "output": str(folder), **FAST})
    status = _call("loop_status", {"workload": workload})  # bench is done only once validate has read bench.json
    assert (status["next_stage"], status["resume_from"]) == ("bench", "bench")
    assert status["reason"] == "validation_report.json was not written from bench.json: run validate again with it"
    assert [c["file"] for c in status["checkpoints"] if c["provenance"] == "loop_state"] == [  # the tools' files
        "analysis.json", "recipes.json", "proposal.md", "implementation.md", "validation_report.json",
        "comparison.json", "comparison.md", "bench.json", "bench_vs_free.json"]
    _call("validate", {"baseline": workload, "optimized": optimized, "seeds": [0], "bench_json":
                       str(folder / "bench.json"), "analysis": str(folder / "analysis.json"),
                       "optimizations": str(folder / "optimizations.json"), "output": str(folder)})
    status = _call("loop_status", {"workload": workload})
    assert (status["next_stage"], status["resume_from"]) == ("report", "report")
    _call("report", {"baseline_profile": str(folder / "profile.json"),  # 10. report
                     "optimized_profile": str(folder / "profile_optimized.json"),
                     "baseline_analysis": str(folder / "analysis.json"), "comparison": str(folder / "comparison.json"),
                     "bench_json": str(folder / "bench.json"), "recipes": str(folder / "recipes.json"),
                     "bench_vs_free": str(folder / "bench_vs_free.json"),
                     "validation": str(folder / "validation_report.json"),
                     "optimizations": str(folder / "optimizations.json"), "output": str(folder)})
    status = _call("loop_status", {"workload": workload})
    assert status["next_stage"] is None and "complete" in status["summary"], status["reason"]
    assert {s["status"] for s in status["stages"]} == {"done"}
    report = read_state(folder).checkpoints["report.md"]
    assert {i.path for i in report.inputs} == {"profile.json", "profile_optimized.json", "analysis.json",
                                               "comparison.json", "bench.json", "recipes.json", "bench_vs_free.json",
                                               "validation_report.json", "optimizations.json"}

    with open(optimized, "a", encoding="utf-8") as handle:  # the workload edited after the loop closed
        handle.write("# edited\n")
    status = _call("loop_status", {"workload": workload})
    assert (status["next_stage"], status["resume_from"]) == ("validate", "validate")
    assert "tiny_mlp_optimized.py" in status["reused"] and "report.md" in status["recompute"]
    assert status["recompute"][0] == "validation_report.json"
