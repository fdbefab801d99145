"""The optimization loop's state: the checkpoints the tools record in loop_state.json, and loop_status's verdict.

Real runs on this CPU of the tiny MLP in tests/workloads/: one profile and analyze build a loop folder (shared,
copied by each test), and the tests run validate, compare, bench and report into their copy as the loop does.
The files the agents write (optimizations.json, the optimized workload, profile_optimized.json) are copied or
written here, as the agents would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from conftest import REPO
from mcp import Client

from mcp_server import api
from mcp_server.analysis.analyze import ANALYSIS_JSON
from mcp_server.compare import COMPARISON_JSON, COMPARISON_MD
from mcp_server.errors import ProfileFormatError
from mcp_server.loop import STAGES, Recorder, loop_status, read_state
from mcp_server.loop import stages as table
from mcp_server.loop.state import sha256_of
from mcp_server.proof.bench import bench_file
from mcp_server.proof.recipes import RECIPES_JSON
from mcp_server.proof.validate import VALIDATION_JSON, generated_test_path
from mcp_server.render.render import IMPLEMENTATION_MD, OPTIMIZED_WORKLOAD_MD, PROPOSAL_MD, REPORT_MD
from mcp_server.rundir import PROFILE
from mcp_server.schema.optimizations import OPTIMIZATIONS_JSON
from mcp_server.schema.requests import (
    AnalyzeRequest,
    Interpreter,
    ProfileRequest,
    RecipesRequest,
    RecipeTiming,
    ReportRequest,
    ValidateRequest,
)
from mcp_server.schema.results import LoopStatusResult
from mcp_server.schema.types import STAGE_NAMES
from mcp_server.serve.app import server
from mcp_server.serve.paths import PROJECT_ENV

WORKLOADS = REPO / "tests" / "workloads"
PYTHON = Interpreter(python=sys.executable)
LOOP_STATE_MD = REPO / "skills" / "optimize" / "references" / "loop-state.md"


def _stage(status: LoopStatusResult, name: str):
    return next(s for s in status.stages if s.stage == name)


def _checkpoint(status: LoopStatusResult, name: str):
    return next(c for c in status.checkpoints if c.file == name)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A loop folder after the profile and recipes stages: tiny_mlp.py profiled on the CPU, its profile.json copied
    beside it (the capture agent's copy), `analyze` run with the folder as output, and its free frontier (the
    reference and one recipe) measured into it."""
    folder = tmp_path_factory.mktemp("loop")
    shutil.copy(WORKLOADS / "tiny_mlp.py", folder)
    shutil.copy(WORKLOADS / "tiny_passes.py", folder)
    run = api.profile(ProfileRequest(workload=folder / "tiny_mlp.py", python=PYTHON, backend="torch",
                                     output=tmp_path_factory.mktemp("run") / "run", project=folder))
    shutil.copy(run.profile_path, folder / "profile.json")
    api.analyze(AnalyzeRequest(profile=folder / "profile.json", output=folder, project=folder, measure=False))
    api.recipes(RecipesRequest(workload=folder / "tiny_mlp.py", python=PYTHON, only=("eager+bf16-autocast",),
                               seeds=(0,), timing=RecipeTiming(warmup=1, budget_s=0.1), output=folder, project=folder))
    return folder


@pytest.fixture()
def loop(analysed: Path, tmp_path: Path) -> Path:
    """This test's copy of the analysed loop folder (modification times kept)."""
    return Path(shutil.copytree(analysed, tmp_path / "loop"))


def _planned(folder: Path) -> None:
    """The propose stage's files, as the strategist and the report tool leave them (here by hand: no records)."""
    for name in ("optimizations.json", "proposal.md", "implementation.md"):
        (folder / name).write_text("{}\n" if name.endswith(".json") else f"# {name}\n")


def _implemented(folder: Path, optimized: str = "tiny_mlp_optimized.py") -> Path:
    """The implement stage's files: the optimized workload (`optimized` from tests/workloads) and its test."""
    shutil.copy(WORKLOADS / optimized, folder / "tiny_mlp_optimized.py")
    shutil.copy(WORKLOADS / "test_tiny_mlp_optimized.py", folder)
    return folder / "tiny_mlp_optimized.py"


def _validate(folder: Path, **extra: object) -> None:
    api.validate(ValidateRequest(baseline=folder / "tiny_mlp.py", optimized=folder / "tiny_mlp_optimized.py",
                                 python=PYTHON, seeds=(0,), run_tests=False, output=folder, project=folder, **extra))


# --------------------------------------------------------------------------- the stage table


def test_the_stage_table_is_the_one_loop_state_md_prints():
    rows = re.findall(r"^\| `(\w+)` \|([^|]*)\|([^|]*)\|", LOOP_STATE_MD.read_text(encoding="utf-8"), re.MULTILINE)
    printed = [(name, re.findall(r"`([\w.]+)`", reads), re.findall(r"`([\w.]+)`", writes))
               for name, reads, writes in rows]
    coded = [(s.name, [t.format(name="NAME") for t in s.reads], [t.format(name="NAME") for t in s.writes])
             for s in STAGES]
    assert printed == coded
    skill = (REPO / "skills" / "optimize" / "SKILL.md").read_text(encoding="utf-8")
    assert re.findall(r"^\| `(\w+)` \|", skill, re.MULTILINE) == [s.name for s in STAGES] == list(STAGE_NAMES)


def test_the_table_names_the_files_the_tools_write():
    assert table.PROFILE == PROFILE and table.ANALYSIS == ANALYSIS_JSON and table.VALIDATION == VALIDATION_JSON
    assert (table.COMPARISON_JSON, table.COMPARISON_MD) == (COMPARISON_JSON, COMPARISON_MD)
    assert [bench_file(m) for m in ("eager", "free")] == [table.BENCH, table.BENCH_VS_FREE]
    assert table.RECIPES == RECIPES_JSON
    assert (table.PROPOSAL, table.IMPLEMENTATION, table.REPORT, table.OPTIMIZED_WORKLOAD) == (
        PROPOSAL_MD, IMPLEMENTATION_MD, REPORT_MD, OPTIMIZED_WORKLOAD_MD)
    assert table.OPTIMIZATIONS == OPTIMIZATIONS_JSON
    optimized = Path(table.OPTIMIZED.format(name="w"))
    assert generated_test_path(optimized).name == table.OPTIMIZED_TEST.format(name="w")


# --------------------------------------------------------------------------- the verdicts


def test_an_empty_folder_starts_at_profile(tmp_path: Path):
    shutil.copy(WORKLOADS / "tiny_mlp.py", tmp_path)
    status = loop_status(tmp_path / "tiny_mlp.py")
    assert (status.next_stage, status.resume_from) == ("profile", "profile")
    assert status.reason == "missing: profile.json, analysis.json"
    assert _stage(status, "preflight").status == "done"
    assert {s.status for s in status.stages[1:]} == {"missing"}
    assert status.loop_state_path is None and status.reused == []
    assert status.recompute[:2] == ["profile.json", "analysis.json"] and "OPTIMIZED_WORKLOAD.md" in status.recompute
    assert all(c.provenance is None for c in status.checkpoints)


def test_analyze_into_the_loop_folder_records_the_profile_it_read(loop: Path):
    state = read_state(loop)
    assert state is not None and list(state.checkpoints) == ["analysis.json", "recipes.json"]
    recipes = state.checkpoints["recipes.json"]
    assert recipes.tool == "recipes" and [i.path for i in recipes.inputs] == ["tiny_mlp.py"]
    record = state.checkpoints["analysis.json"]
    assert record.tool == "analyze" and record.sha256 == sha256_of(loop / "analysis.json")
    assert [(i.path, i.sha256) for i in record.inputs] == [("profile.json", sha256_of(loop / "profile.json"))]
    status = loop_status(loop / "tiny_mlp.py")
    assert _stage(status, "profile").status == "done"
    assert (status.next_stage, status.resume_from) == ("propose", "propose")
    analysis, profile = _checkpoint(status, "analysis.json"), _checkpoint(status, "profile.json")
    assert (analysis.provenance, analysis.tool, analysis.written_at) == ("loop_state", "analyze", record.written_at)
    assert (profile.provenance, profile.tool) == ("mtime", None)
    assert status.reused == ["profile.json", "analysis.json", "recipes.json"]


def test_an_ordinary_output_folder_gets_no_loop_state(loop: Path, tmp_path: Path):
    out = tmp_path / "analysis"
    api.analyze(AnalyzeRequest(profile=loop / "profile.json", output=out, project=tmp_path, measure=False))
    assert (out / "analysis.json").is_file() and not (out / "loop_state.json").exists()


def test_a_changed_profile_makes_the_analysis_stale(loop: Path):
    with open(loop / "profile.json", "a", encoding="utf-8") as handle:
        handle.write("\n")  # the same profile to a reader, another file to its hash
    status = loop_status(loop / "tiny_mlp.py")
    assert (status.next_stage, status.resume_from) == ("profile", "profile")
    assert status.reason == "analysis.json is stale: profile.json changed since analyze read it"
    assert _checkpoint(status, "profile.json").status == "done"
    assert status.reused == ["profile.json"] and status.recompute[0] == "analysis.json"


def test_a_missing_optimized_workload_is_implement_next(loop: Path):
    _planned(loop)
    status = loop_status(loop / "tiny_mlp.py")
    assert (status.next_stage, status.resume_from) == ("implement", "implement")
    assert status.reason == "missing: tiny_mlp_optimized.py, test_tiny_mlp_optimized.py"
    assert _checkpoint(status, "proposal.md").provenance == "mtime"
    (loop / "optimizations.json").write_text('{"changed": true}\n')  # the plan documents are now older than it
    later = (loop / "proposal.md").stat().st_mtime_ns + 10_000_000_000  # beyond the slack for files written together
    os.utime(loop / "optimizations.json", ns=(later, later))
    status = loop_status(loop / "tiny_mlp.py")
    assert (status.next_stage, _stage(status, "propose").status) == ("propose", "stale")


def test_a_failed_validation_goes_back_to_implement_until_the_workload_changes(loop: Path):
    _planned(loop)
    optimized = _implemented(loop, "tiny_mlp_wrong_numerics_optimized.py")
    _validate(loop)
    status = loop_status(loop / "tiny_mlp.py")
    assert _stage(status, "validate").status == "failed"
    assert (status.next_stage, status.resume_from) == ("validate", "implement")
    assert status.reason.startswith("validation_report.json did not pass (failed: ")
    assert "numerics" in status.reason and status.reason.endswith("; fix it at implement")
    report = _checkpoint(status, "validation_report.json")
    assert (report.provenance, report.tool, report.status) == ("loop_state", "validate", "failed")
    assert status.recompute[:3] == ["tiny_mlp_optimized.py", "test_tiny_mlp_optimized.py", "validation_report.json"]
    recorded = {i.path for i in read_state(loop).checkpoints["validation_report.json"].inputs}
    assert recorded == {"tiny_mlp.py", "tiny_mlp_optimized.py"}

    shutil.copy(WORKLOADS / "tiny_mlp_optimized.py", optimized)  # the backend engineer's fix
    status = loop_status(loop / "tiny_mlp.py")
    assert (status.next_stage, status.resume_from) == ("validate", "validate")
    assert status.reason == "validation_report.json is stale: tiny_mlp_optimized.py changed since validate read it"
    _validate(loop)
    status = loop_status(loop / "tiny_mlp.py")
    assert _stage(status, "validate").status == "done" and status.next_stage == "reprofile"


def test_a_corrupt_loop_state_is_an_error_with_a_remedy(loop: Path):
    (loop / "loop_state.json").write_text("{not json")
    with pytest.raises(ProfileFormatError, match="loop_state.json is corrupt") as raised:
        loop_status(loop / "tiny_mlp.py")
    assert "delete loop_state.json" in raised.value.remedy
    proc = _cli("loop-status", str(loop / "tiny_mlp.py"))
    assert proc.returncode == 1 and "delete loop_state.json" in proc.stderr


# --------------------------------------------------------------------------- two writers


def test_two_tools_recording_at_once_both_keep_their_record(tmp_path: Path):
    shutil.copy(WORKLOADS / "tiny_mlp.py", tmp_path)
    (tmp_path / "profile.json").write_text("{}\n")
    for name in ("analysis.json", "bench.json"):
        (tmp_path / name).write_text(f"{name}\n")
    workload = tmp_path / "tiny_mlp.py"

    def write(name: str, tool: str, start: threading.Barrier) -> None:
        recorder = Recorder(tmp_path, tool, [tmp_path / "profile.json"], [workload])
        start.wait()
        recorder.record([tmp_path / name])

    for _ in range(20):
        (tmp_path / "loop_state.json").unlink(missing_ok=True)
        start = threading.Barrier(2)
        threads = [threading.Thread(target=write, args=(*a, start)) for a in (("analysis.json", "analyze"),
                                                                              ("bench.json", "bench"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        state = read_state(tmp_path)
        assert state is not None and set(state.checkpoints) == {"analysis.json", "bench.json"}
        assert {r.tool for r in state.checkpoints.values()} == {"analyze", "bench"}
    assert not list(tmp_path.glob(".*")), "the lock is the folder's own: no lock file is left beside the user's files"


# --------------------------------------------------------------------------- the faces


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def test_the_cli_prints_the_next_stage_and_exits_0(loop: Path, tmp_path: Path):
    proc = _cli("loop-status", str(loop / "tiny_mlp.py"))
    assert proc.returncode == 0, proc.stderr
    assert "resume with --from=propose" in proc.stdout
    assert re.search(r"^analysis\.json +done +loop_state +analyze at ", proc.stdout, re.MULTILINE)
    assert re.search(r"^profile\.json +done +mtime ", proc.stdout, re.MULTILINE)
    proc = _cli("loop-status", str(loop / "tiny_mlp.py"), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["resume_from"] == "propose"
    proc = _cli("loop-status", str(tmp_path / "nope.py"))
    assert proc.returncode == 1 and "workload not found" in proc.stderr
    help_text = _cli("loop-status", "--help").stdout
    assert "--json" in help_text and "Exit status 0" in help_text


def test_the_mcp_tool_through_a_client(loop: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROJECT_ENV, str(loop))  # the loop's folder is the client's project

    async def ask() -> dict:
        async with Client(server) as client:
            result = await client.call_tool("loop_status", {"workload": str(loop / "tiny_mlp.py")})
            assert not result.is_error, result.content
            return result.structured_content or {}

    found = anyio.run(ask)
    assert (found["next_stage"], found["resume_from"]) == ("propose", "propose")
    assert _checkpoint(LoopStatusResult.model_validate(found), "analysis.json").provenance == "loop_state"


def test_marking_the_plan_implemented_keeps_the_plan_current_but_a_changed_plan_does_not(loop: Path):
    from test_render import sample_plan  # the render tests' two-item plan

    plan = sample_plan(str(loop / "tiny_mlp.py")).model_dump(mode="json")
    for item in plan["items"]:
        item["status"], item["status_reason"] = "proposed", None
    (loop / "optimizations.json").write_text(json.dumps(plan))
    api.report(ReportRequest(baseline_profile=loop / "profile.json", optimizations=loop / "optimizations.json",
                             analysis=loop / "analysis.json", plan=True, output=loop, project=loop))
    _implemented(loop)
    plan["items"][0].update(status="implemented", status_reason="tiny_mlp_optimized.py:24")  # after the workload
    plan["items"][1].update(status="deferred", status_reason="needs static shapes")
    (loop / "optimizations.json").write_text(json.dumps(plan))
    status = loop_status(loop / "tiny_mlp.py")
    assert [_stage(status, s).status for s in ("propose", "implement")] == ["done", "done"]
    assert status.next_stage == "validate"

    plan["items"][0]["title"] = "Fuse scale-and-shift into one kernel"  # what the plan asks for changed
    (loop / "optimizations.json").write_text(json.dumps(plan))
    status = loop_status(loop / "tiny_mlp.py")
    assert (status.next_stage, _stage(status, "propose").status) == ("propose", "stale")
    assert status.reason.startswith("proposal.md is stale: optimizations.json changed since report read it")
