"""Every MCP tool through a real in-process client (`mcp.Client(server)`): CPU runs of the shrunken examples,
recorded H200 run directories for GPU data, concurrency, cancellation, timeouts and errors with remedies."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import EXAMPLES, REPO
from mcp import Client
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from mcp_server.errors import UsageError
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import load_profile
from mcp_server.schema.requests import Interpreter
from mcp_server.schema.results import ProfileRun
from mcp_server.serve.app import server
from mcp_server.serve.interpreter import PYTHON_ENV, choose_python
from mcp_server.serve.paths import ALLOWED_ENV, PROJECT_ENV
from mcp_server.serve.runner import run_engine
from mcp_server.serve.strict import StrictServer
from plugins.ncu.command import find_ncu

FIXTURES = REPO / "tests" / "fixtures"
WORKLOADS = REPO / "tests" / "workloads"
TOOLS = {"preflight", "profile", "map", "assemble", "analyze", "compare", "bench", "validate", "report",
         "top_operators", "operator_detail", "kernel_detail", "loop_status", "memory", "recipes", "optimize"}
READ_ONLY = {"preflight", "top_operators", "operator_detail", "kernel_detail", "loop_status"}
SLOW_WORKLOAD = """\
import time
from pathlib import Path

import torch


def get_model_and_input():
    Path({pid_file!r}).write_text(str(__import__("os").getpid()))
    time.sleep(120)
    return torch.nn.Identity(), (torch.zeros(1),)
"""


# --------------------------------------------------------------------------- helpers


async def _call(name: str, args: dict[str, Any], messages: list[str] | None = None) -> CallToolResult:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if messages is not None and message is not None:
            messages.append(message)

    async with Client(server) as client:
        return await client.call_tool(name, args, progress_callback=on_progress)


def call(name: str, args: dict[str, Any], messages: list[str] | None = None) -> CallToolResult:
    """Call one tool through a fresh in-process client."""
    return anyio.run(_call, name, args, messages)


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured content of a successful call."""
    assert not result.is_error, result.content[0].text if result.content else result
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


def extract(archive: str, into: Path) -> Path:
    """Extract tests/fixtures/<archive>.tar.xz into `into` (each holds an nsys+ncu and a torch run)."""
    with tarfile.open(FIXTURES / f"{archive}.tar.xz", "r:xz") as tar:
        tar.extractall(into, filter="data")
    return into


def gone(pid: int) -> bool:
    """True when neither the process nor anything left in its process group exists."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return not Path(f"/proc/{pid}").exists()
    return False


@pytest.fixture(scope="module", autouse=True)
def project(tmp_path_factory: pytest.TempPathFactory):
    """The client's project directory (CLAUDE_PROJECT_DIR), with this repository's test workloads allowed beside it;
    workloads run under this test's interpreter."""
    root = tmp_path_factory.mktemp("project")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PROJECT_ENV, str(root))
        mp.setenv(ALLOWED_ENV, str(REPO / "tests"))
        mp.setenv(PYTHON_ENV, sys.executable)
        yield root


@pytest.fixture(scope="module")
def two_runs(project: Path) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """Two `profile` calls at once on the same workload (given relative to the project), same second."""
    shutil.copy(EXAMPLES / "conv_block" / "conv_block.py", project / "conv_block.py")
    results: list[CallToolResult | None] = [None, None]
    messages: list[list[str]] = [[], []]

    async def both() -> None:
        async with Client(server) as client:
            async def one(i: int) -> None:
                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    messages[i].append(message or "")

                results[i] = await client.call_tool(
                    "profile", {"workload": "conv_block.py", "top": 5}, progress_callback=on_progress
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, 0)
                tg.start_soon(one, 1)

    anyio.run(both)
    return [ok(r) for r in results], messages


@pytest.fixture(scope="module")
def gpu_runs(project: Path) -> dict[str, Path]:
    """Recorded H200 nsys+ncu run directories of conv_block, eager and inductor."""
    extract("h200_conv_block_eager", project / "fixtures")
    extract("h200_conv_block_inductor", project / "fixtures")
    return {m: project / "fixtures" / f"conv_block_{m}" for m in ("eager", "inductor")}


# --------------------------------------------------------------------------- listing


def _hook_module(name: str):
    """A plugin hook script, imported the way Claude Code runs it (its folder on sys.path)."""
    hooks = str(REPO / "hooks")
    sys.path.insert(0, hooks)
    try:
        spec = importlib.util.spec_from_file_location(f"hook_{name}", REPO / "hooks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(hooks)


def test_every_tool_is_listed_with_an_output_schema_and_hints():
    async def listing():
        async with Client(server) as client:
            return (await client.list_tools()).tools

    tools = {t.name: t for t in anyio.run(listing)}
    assert set(tools) == TOOLS
    for name, t in tools.items():
        assert t.description and "\n    " not in t.description, name
        assert t.output_schema and t.output_schema["type"] == "object", name
        assert t.annotations.read_only_hint is (name in READ_ONLY), name
    assert _hook_module("post_tool_use").WRITES_NOTHING == READ_ONLY  # the hook reads no file from their results
    assert {"run_dir", "profile_path", "files", "interpreter"} <= set(tools["profile"].output_schema["properties"])
    backend = tools["profile"].input_schema["properties"]["backend"]  # the registry, not the schema, names them
    assert backend["default"] == "auto" and backend["type"] == "string" and "enum" not in backend
    assert tools["map"].annotations.destructive_hint is True


# --------------------------------------------------------------------------- profile and queries (CPU runs)


def test_two_profiles_at_once_get_their_own_run_directories(two_runs, project: Path):
    (first, second), messages = two_runs
    assert first["run_dir"] != second["run_dir"]
    for run, said in zip((first, second), messages, strict=True):
        run_dir = Path(run["run_dir"])
        assert run_dir.parent == project / "op_runs" and run_dir.name.startswith("conv_block-")
        profile = load_profile(Path(run["profile_path"]))
        assert ProfileRun.model_validate(run).profile.workload == str(project / "conv_block.py")
        assert str(run_dir / "torch" / "kineto_trace.json") in run["files"]
        assert all(Path(f).is_file() for f in run["files"])
        assert run["interpreter"] == {
            "python": sys.executable, "source": PYTHON_ENV,
            "executable": profile.capture_metadata.python_executable,
            "torch_version": profile.capture_metadata.torch_version,
        }
        assert run["interpreter"]["torch_version"][0].isdigit()
        assert run["backend"] == "torch" and run["window"]["operator_count"] == len(profile.operators) == 24
        # Ranked by CPU time on this machine (two runs at once on two cores: which heavy op leads depends on its
        # timing, max_pool2d once): the digest is the profile's own ranking, heaviest first, convolutions among them.
        shares = [op["share_pct"] for op in run["top_operators"]]
        names = [op["operator_name"] for op in run["top_operators"]]
        assert shares == sorted(shares, reverse=True) and "aten::conv2d" in names, names
        conv = next(op for op in run["top_operators"] if op["operator_name"] == "aten::conv2d")
        assert sorted(conv["operator_ids"]) == [f"aten::conv2d#{i}" for i in range(6)]
        assert any(m.startswith("torch.profiler pass:") for m in said), said
        assert said[-1] == "assembling profile.json"
    if not first["profile"]["gpu_used"]:
        assert "NO GPU USED" in first["backend_note"]


def test_top_operators_takes_a_relative_run_directory(two_runs):
    run = two_runs[0][0]
    top = ok(call("top_operators", {"profile": f"op_runs/{Path(run['run_dir']).name}", "limit": 3}))
    assert top["profile"]["profile_path"] == run["profile_path"]
    assert top["time_basis"] == "cpu_total_time" and top["operator_names"] == 7
    assert [r["operator_name"] for r in top["operators"]] == [r["operator_name"] for r in run["top_operators"][:3]]
    shares = [r["share_pct"] for r in top["operators"]]
    assert shares == sorted(shares, reverse=True)


def test_operator_detail_of_a_cpu_profile(two_runs):
    run = two_runs[0][0]
    detail = ok(call("operator_detail", {"profile": run["profile_path"], "operator_id": "aten::conv2d#0"}))
    assert detail["module_path"] == "features.0.conv"
    assert detail["input_shapes"][0] == [2, 3, 32, 32] and detail["input_dtypes"][0] == "float"
    assert detail["kernel_count"] == 0 and detail["kernels"] == [] and detail["aggregated"]["cpu_total_time_ns"] > 0
    text = error_text(call("operator_detail", {"profile": run["run_dir"], "operator_id": "aten::conv2d#99"}))
    assert "no operator 'aten::conv2d#99'" in text and "pass an operator_id from top_operators" in text
    assert "aten::conv2d#" in text.split("e.g.")[1]
    text = error_text(call("kernel_detail", {"profile": run["run_dir"], "kernel_id": 0}))
    assert "holds no kernels: it was captured without a GPU" in text and "use operator_detail" in text


def test_map_refuses_a_torch_run(two_runs):
    text = error_text(call("map", {"run_dir": two_runs[0][0]["run_dir"]}))
    assert "was captured with backend torch" in text and "profile with backend='nsys'" in text


# --------------------------------------------------------------------------- errors, cancellation, timeouts


def test_a_missing_workload_is_a_tool_error_with_a_remedy(project: Path):
    text = error_text(call("profile", {"workload": "no_such_model.py"}))
    assert f"workload not found: {project / 'no_such_model.py'}" in text
    assert "pass an existing .py file; relative paths resolve against" in text
    assert not (project / "op_runs" / "no_such_model").exists()


def test_a_crashing_workload_reports_its_traceback_tail():
    text = error_text(call("profile", {"workload": str(REPO / "tests" / "scripts" / "raises.py")}))
    assert "shape mismatch in layer 3" in text and "output.log" in text


def test_cancelling_a_profile_kills_its_child(project: Path):
    pid_file = project / "slow.pid"
    (project / "slow_model.py").write_text(SLOW_WORKLOAD.format(pid_file=str(pid_file)))

    async def cancel_when_running() -> tuple[int, float]:
        async with Client(server) as client, anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "profile", {"workload": "slow_model.py"})
            with anyio.fail_after(60):
                while not pid_file.is_file() or not pid_file.read_text():
                    await anyio.sleep(0.05)
            t0 = time.monotonic()
            tg.cancel_scope.cancel()
        return int(pid_file.read_text()), time.monotonic() - t0

    pid, took = anyio.run(cancel_when_running)
    assert gone(pid), f"the workload's process {pid} outlived the cancelled request"
    assert took < 10


def test_a_pass_past_its_timeout_is_stopped(project: Path):
    pid_file = project / "slow_timeout.pid"
    (project / "slow_timeout.py").write_text(SLOW_WORKLOAD.format(pid_file=str(pid_file)))
    text = error_text(call("profile", {"workload": "slow_timeout.py", "timeout_s": 4}))
    assert "ran past its 4 s limit and was stopped" in text
    if pid_file.is_file():
        assert gone(int(pid_file.read_text()))


def test_the_tool_limit_stops_the_engine_call():
    stopped: list[bool] = []

    def work(progress, cancel):
        stopped.append(cancel.wait(30))
        return "finished"

    with pytest.raises(ToolError, match="ran past the tool's 0 s limit and was stopped"):
        anyio.run(run_engine, None, "probe", work, 0.2)
    assert stopped == [True], "the worker saw the cancel event and returned before run_engine did"


# --------------------------------------------------------------------------- recorded GPU runs


def test_assemble_and_query_a_recorded_h200_run(gpu_runs):
    run = ok(call("assemble", {"run_dir": str(gpu_runs["eager"])}))
    assert run["backend"] == "nsys+ncu" and run["profile"]["gpu_used"] is True
    assert "H200" in run["profile"]["device_name"]
    assert run["interpreter"] == {"python": "/opt/torch/.venv/bin/python3", "source": "manifest",
                                  "executable": "/opt/torch/.venv/bin/python3", "torch_version": "2.11.0+cu130"}
    assert run["window"]["kernel_count"] == 23 and run["window"]["kernels_with_counters"] == 23
    assert run["window"]["kernel_time_ns"] == 56992
    assert str(gpu_runs["eager"] / "ncu" / "report.ncu-rep") in run["files"]

    top = ok(call("top_operators", {"profile": run["profile_path"], "limit": 50}))
    assert top["time_basis"] == "gpu_kernel_time"
    assert sum(r["gpu_time_ns"] for r in top["operators"]) == 56992

    detail = ok(call("operator_detail", {"profile": run["run_dir"], "operator_id": "aten::conv2d#0"}))
    assert detail["module_path"] == "features.0.conv" and detail["kernel_count"] == 1
    assert detail["kernels"][0]["kernel_id"] == 0 and detail["kernels"][0]["metric_count"] == 54
    assert "dram_bytes_read" in detail["counter_names"] and len(detail["counter_names"]) == 54

    kernel = ok(call("kernel_detail", {"profile": run["run_dir"], "kernel_id": 0}))
    assert kernel["operator_id"] == "aten::conv2d#0" and kernel["kernel"]["duration_ns"] == 3584
    assert kernel["kernel"]["metrics"]["dram_bytes_read"] == {"value": 62976.0, "unit": "byte"}
    replayed = ok(call("kernel_detail", {"profile": run["run_dir"], "kernel_id": 1}))
    assert replayed["operator_id"] == "aten::batch_norm#0" and replayed["propagated_to"] == [4]
    text = error_text(call("kernel_detail", {"profile": run["run_dir"], "kernel_id": 23}))
    assert "kernel ids run 0..22" in text and "pass a kernel_id from operator_detail" in text


def test_analyze_a_recorded_h200_run(gpu_runs, project: Path):
    ok(call("assemble", {"run_dir": str(gpu_runs["eager"])}))
    result = ok(call("analyze", {"profile": str(gpu_runs["eager"]), "measure": False}))
    out = Path(result["out_dir"])
    assert out.parent == project / "op_runs" and out.name.startswith("conv_block-analysis-")
    assert result["analysis_path"] == str(out / "analysis.json") and result["analysis_path"] in result["files"]
    written = Analysis.model_validate_json(Path(result["analysis_path"]).read_text())
    assert result["diagnosis"] == written.diagnosis.model_dump(mode="json")
    assert result["gpu_data"] is True and result["counters"] is True
    assert result["configuration"]["device"] == "NVIDIA H200"
    assert len(result["opportunities"]) == len(written.opportunities)
    assert [r["label"] for r in result["stages"]] == [r.label for r in written.stages] and result["stages"]
    assert str(out / "trace.json") in result["files"]
    assert result["profile"]["profile_path"] == str(gpu_runs["eager"] / "profile.json")


def test_compare_recorded_eager_and_inductor_runs(gpu_runs, project: Path):
    for mode in ("eager", "inductor"):
        ok(call("assemble", {"run_dir": str(gpu_runs[mode])}))
    result = ok(call("compare", {"baseline": str(gpu_runs["eager"]), "optimized": str(gpu_runs["inductor"]),
                                 "top": 5}))
    out = Path(result["comparison_path"]).parent
    assert out.parent == project / "op_runs" and out.name.startswith("conv_block-compare-")
    assert sorted(result["files"]) == sorted([result["comparison_path"], result["markdown_path"]])
    assert result["match_counts"] == {"matched": 7, "fused": 8, "appeared": 8, "disappeared": 0}
    assert result["time_basis"] == "gpu_kernel_time" and result["operator_delta_count"] == 23
    deltas = [abs(d["time_delta_ns"]) for d in result["operator_deltas"]]
    assert len(deltas) == 5 and deltas == sorted(deltas, reverse=True)
    assert result["summary"].startswith("GPU kernel time 57.0 µs → 54.8 µs")
    assert result["baseline"]["torch_version"] == "2.11.0+cu130"


def test_report_from_the_recorded_runs(gpu_runs, project: Path):
    for mode in ("eager", "inductor"):
        ok(call("assemble", {"run_dir": str(gpu_runs[mode])}))
    analysis = ok(call("analyze", {"profile": str(gpu_runs["eager"]), "measure": False}))
    comparison = ok(call("compare", {"baseline": str(gpu_runs["eager"]), "optimized": str(gpu_runs["inductor"])}))
    result = ok(call("report", {"baseline_profile": str(gpu_runs["eager"]),
                                "optimized_profile": str(gpu_runs["inductor"]),
                                "analysis": analysis["analysis_path"], "comparison": comparison["comparison_path"]}))
    out = Path(result["out_dir"])
    assert out.parent == project / "op_runs" and out.name.startswith("conv_block-report-")
    assert result["files"] == [result["report_path"]] and result["optimized_workload_path"] is None
    text = Path(result["report_path"]).read_text()
    assert "no bench.json: no speedup is claimed" in text and "NVIDIA H200" in text
    missing = error_text(call("report", {"baseline_profile": str(gpu_runs["eager"]), "bench_json": "nowhere.json"}))
    assert "bench result not found" in missing and "pass the bench.json" in missing


def test_map_without_ncu_says_how_to_get_it(gpu_runs):
    if find_ncu() is not None:
        pytest.skip("ncu is installed here: map would really replay (a GPU test)")
    text = error_text(call("map", {"run_dir": str(gpu_runs["eager"]), "launch_count": 1}))
    assert "ncu not found" in text and "install Nsight Compute or set NCU=" in text


# --------------------------------------------------------------------------- bench, validate, preflight


def test_bench_then_validate_the_tiny_workloads(project: Path):
    said: list[str] = []
    bench = ok(call("bench", {"baseline": str(WORKLOADS / "tiny_mlp.py"),
                              "optimized": str(WORKLOADS / "tiny_mlp_optimized.py"),
                              "warmup": 1, "calls": 10, "queued": 10, "blocks": 1, "budget_s": 0.1, "rounds": 3,
                              "input_sets": 1, "interleave": True}, said))
    out = Path(bench["out_dir"])
    assert out.parent == project / "op_runs" and out.name.startswith("tiny_mlp_optimized-bench-")
    assert Path(bench["bench_path"]).is_file() and bench["bench_path"] in bench["files"]
    assert bench["baseline"]["latency"]["samples"] == bench["optimized"]["latency"]["samples"] == 30
    assert bench["headline"] == "latency" and bench["speedup"] == bench["latency_speedup"]
    assert bench["speedup"]["point"] > 0 and bench["interpreter"]["source"] == PYTHON_ENV
    assert bench["interpreter"]["torch_version"][0].isdigit()
    assert "bench: round 3/3, both sides in fresh processes, timing 1 block(s) each in turns" in said

    said.clear()
    report = ok(call("validate", {"baseline": str(WORKLOADS / "tiny_mlp.py"),
                                  "optimized": str(WORKLOADS / "tiny_mlp_optimized.py"), "seeds": [0],
                                  "run_tests": False, "bench_json": bench["bench_path"],
                                  "max_plausible_speedup": 1000.0}, said))
    assert report["passed"] is True and report["failed_checks"] == []
    assert Path(report["report_path"]).is_file() and report["report_path"] in report["files"]
    assert report["speedup"] == bench["speedup"]["point"]
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert checks["speedup_plausible"] == "pass" and checks["pytest"] == "skip"
    assert report["interpreter"]["torch_version"] == bench["interpreter"]["torch_version"]
    assert report["summary"].startswith("PASS: tiny_mlp_optimized.py against tiny_mlp.py")
    assert any(m.startswith("validate:") for m in said)


def test_bench_refuses_bad_counts_without_leaving_a_directory(project: Path):
    before = set((project / "op_runs").iterdir()) if (project / "op_runs").is_dir() else set()
    text = error_text(call("bench", {"baseline": str(WORKLOADS / "tiny_mlp.py"),
                                     "optimized": str(WORKLOADS / "tiny_mlp_optimized.py"), "calls": 0}))
    assert "calls" in text.lower()
    after = set((project / "op_runs").iterdir()) if (project / "op_runs").is_dir() else set()
    assert after == before


def test_preflight_names_the_interpreter_and_its_torch(two_runs):
    result = ok(call("preflight", {}))
    names = [c["name"] for c in result["checks"]]
    assert names[0] == "gpu" and "torch" in names and "nsys" in names and "ncu" in names
    assert all(c["remedy"] for c in result["checks"] if not c["ok"])
    assert result["interpreter"]["python"] == sys.executable
    assert result["interpreter"]["torch_version"] == two_runs[0][0]["interpreter"]["torch_version"]
    if not result["ok"]:
        assert "FAIL" in result["summary"]


# --------------------------------------------------------------------------- the interpreter choice


def test_interpreter_choice_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(PROJECT_ENV, str(tmp_path))
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    if shutil.which("python3") is None:
        with pytest.raises(UsageError, match="no python3 on PATH"):
            choose_python()
    else:
        assert choose_python() == Interpreter(python=shutil.which("python3"), source="PATH")
    venv = tmp_path / ".venv" / "bin" / "python"
    venv.parent.mkdir(parents=True)
    venv.symlink_to(sys.executable)
    assert (choose_python().python, choose_python().source) == (str(venv), "project .venv")
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert (choose_python().python, choose_python().source) == (sys.executable, PYTHON_ENV)
    assert (choose_python(".venv/bin/python").python, choose_python(".venv/bin/python").source) == (
        str(venv), "argument")
    with pytest.raises(UsageError, match="looks like an option"):
        choose_python("-c")
    with pytest.raises(UsageError) as missing:
        choose_python("envs/none/bin/python")
    assert str(tmp_path / "envs/none/bin/python") in missing.value.message and PYTHON_ENV in missing.value.remedy


class _Item(BaseModel):
    x: int = Field(description="nested, described at length " * 10)


class _Made(BaseModel):
    name: str
    items: list[_Item]


def test_any_tool_registered_is_listed_slim_and_called_strictly():
    """The slimming is the server's, not each tool's: a tool added to it any way gets it."""
    other = StrictServer(name="other")

    @other.tool()
    def made(count: int, label: str | None = None) -> _Made:
        """A tool registered without the operator-profiler decorator."""
        return _Made(name=label or "x", items=[_Item(x=count)])

    async def session() -> tuple[Any, CallToolResult, CallToolResult]:
        async with Client(other) as client:
            listed = (await client.list_tools()).tools[0]
            return listed, await client.call_tool("made", {"count": 2}), await client.call_tool(
                "made", {"count": 2, "colour": "red"})

    listed, called, refused = anyio.run(session)
    assert listed.output_schema == {"type": "object", "properties": {"name": {}, "items": {}}}
    assert listed.input_schema == {"type": "object", "properties": {"count": {"type": "integer"},
                                                                     "label": {"type": "string"}},
                                   "required": ["count"], "additionalProperties": False}
    assert ok(called) == {"name": "x", "items": [{"x": 2}]}  # the structured content itself is whole
    assert error_text(refused).endswith("unknown parameter colour — made takes count, label")
