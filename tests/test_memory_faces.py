"""The memory pass through its faces on this CPU machine: the CLI and the MCP tool refuse to capture without a GPU
(one line, a remedy, nothing written), rebuild memory.json from a run directory, and `summary` and `report` show
the memory section of a run that has one; a harness pass that runs out of memory is told apart from other failures.
"""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO
from mcp import Client
from memory_recording import WORKLOAD, end_snapshot, record, start_snapshot, write_run

from mcp_server import api
from mcp_server.capture.passes import raise_for_harness
from mcp_server.capture.request import CaptureRequest, WorkloadOptions, harness_command
from mcp_server.children.contract import NO_CUDA, OUT_OF_MEMORY
from mcp_server.cli import main as cli_main
from mcp_server.errors import BackendUnavailable, UsageError, WorkloadError, WorkloadOutOfMemory
from mcp_server.memory.run import diagnosed
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult
from mcp_server.schema.requests import AssembleRequest, Interpreter, ProfileRequest, ReportRequest, SummaryRequest
from mcp_server.serve.app import server
from mcp_server.serve.runner import run_engine
from plugins.executables import has_gpu

TINY = REPO / "tests" / "workloads" / "tiny_mlp.py"
PROFILE = REPO / "tests" / "fixtures" / "h100_timing_profiles" / "encoder_train_step_train_eager.json.xz"
no_gpu = pytest.mark.skipif(has_gpu(), reason="this machine has an NVIDIA GPU: the memory pass would run")


def _call(name: str, args: dict[str, Any]) -> Any:
    async def called() -> Any:
        async with Client(server) as client:
            return await client.call_tool(name, args)

    return anyio.run(called)


@pytest.fixture()
def memory_run(tmp_path: Path) -> RunDir:
    return write_run(tmp_path / "run", start_snapshot(), end_snapshot(), record())


@no_gpu
def test_the_cli_refuses_to_capture_without_a_gpu_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["memory", str(TINY), "--train-step"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no NVIDIA GPU here" in err and " — run it on a machine with an NVIDIA GPU" in err
    assert list(tmp_path.iterdir()) == []


@no_gpu
def test_the_mcp_tool_refuses_to_capture_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(tmp_path))
    monkeypatch.setenv("OPERATOR_PROFILER_ALLOWED_DIRS", str(TINY.parent))  # the workload lies outside the project
    result = _call("memory", {"target": str(TINY), "train_step": True})
    assert result.is_error and "no NVIDIA GPU here" in result.content[0].text
    assert list(tmp_path.iterdir()) == []


def test_the_mcp_tool_rebuilds_memory_json_from_a_run_directory(memory_run, monkeypatch):
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(memory_run.path.parent))
    result = _call("memory", {"target": str(memory_run.path)})
    assert not result.is_error, result.content[0].text
    found = result.structured_content
    assert found["memory_path"] == str(memory_run.path / "memory.json") and memory_run.memory_path.is_file()
    assert found["torch_version"] == "2.11.0+cu130" and found["peak_allocated_bytes"] == 58 * 1024 ** 2
    assert found["snapshot_path"].endswith("memory/snapshot.pickle") and Path(found["chart_path"]).is_file()
    assert "top holders:" in found["summary"] and found["findings"][0].startswith("keep activations in bfloat16")


def test_the_cli_rebuilds_a_run_directory_and_assemble_points_there(memory_run, capsys):
    assert cli_main(["memory", str(memory_run.path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("memory (eager, train_step, NVIDIA H100 80GB HBM3):") and "snapshot:" in out
    with pytest.raises(UsageError, match="holds the memory pass alone") as error:
        api.assemble(AssembleRequest(run_dir=memory_run.path))
    assert "operator-profiler memory RUN_DIR" in error.value.remedy


def _profile_beside(memory_run: RunDir) -> Path:
    """The recorded H100 profile of a training step, as if captured with `run --memory` beside the memory pass."""
    path = memory_run.path / "profile.json"
    path.write_bytes(lzma.decompress(PROFILE.read_bytes()))
    cli_main(["memory", str(memory_run.path), "--quiet"])
    return path


def test_summary_and_report_gain_a_memory_section(memory_run, tmp_path, capsys):
    profile = _profile_beside(memory_run)
    capsys.readouterr()
    found = api.summary(SummaryRequest(profile=profile))
    assert found.memory is not None and "at the peak (0.52 ms, backward aten::mm (MmBackward0) in layers.1)" in \
        found.memory
    assert cli_main(["summary", str(profile)]) == 0
    assert "what lowers the peak (savings are upper-bound estimates):" in capsys.readouterr().out
    written = api.report(ReportRequest(baseline_profile=profile, output=tmp_path / "report", project=tmp_path))
    text = Path(written.report_path).read_text(encoding="utf-8")
    assert "## Memory" in text and "| 1 | 8.00 MiB | 13.9 % | activation | layers.0 | aten::addmm |" in text
    assert "**keep activations in bfloat16**: up to 12.00 MiB" in text and "![memory timeline](" in text


def test_an_out_of_memory_error_carries_its_diagnosis_to_both_faces(tmp_path):
    from test_memory import _oom_recording

    run_dir = write_run(tmp_path / "oom", *_oom_recording())
    error = diagnosed(WorkloadOutOfMemory("the workload ran out of GPU memory", "see memory"), run_dir)
    assert error.message.startswith("out of memory during forward: aten::addmm in layers.3 at " + WORKLOAD)
    assert error.details[0].startswith("    forward (") and "top holders:" in error.details
    assert run_dir.memory_path.is_file()

    def work(progress: Any, cancel: Any) -> None:
        raise error

    async def called() -> str:
        try:
            await run_engine(None, "memory", work, 10.0)
        except Exception as exc:  # noqa: BLE001 - the ToolError the tool returns
            return str(exc)
        return ""

    text = anyio.run(called)
    assert text.splitlines()[0] == error.one_line() and "top holders:" in text.splitlines()


def test_a_pass_that_ran_out_of_memory_is_told_apart_from_other_failures(tmp_path):
    req = CaptureRequest(workload=TINY, run_dir=RunDir(tmp_path))
    message = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of "
               "79.19 GiB of which 1.02 GiB is free.")
    with pytest.raises(WorkloadOutOfMemory, match="ran out of GPU memory during warmup in the nsys pass") as error:
        raise_for_harness(HarnessResult.model_validate(
            {"status": "error", "phase": "warmup", "error": {"kind": OUT_OF_MEMORY, "message": message}}), req, "nsys")
    assert "operator-profiler memory WORKLOAD" in error.value.remedy
    with pytest.raises(BackendUnavailable, match="sees no CUDA device"):
        raise_for_harness(HarnessResult.model_validate(
            {"status": "error", "error": {"kind": NO_CUDA, "message": "torch sees no CUDA device"}}), req, "memory")
    with pytest.raises(WorkloadError) as other:
        raise_for_harness(HarnessResult.model_validate(
            {"status": "error", "error": {"kind": "workload_raised", "message": "ValueError: x"}}), req, "nsys")
    assert not isinstance(other.value, WorkloadOutOfMemory)


def test_the_harness_memory_pass_without_cuda_is_a_no_cuda_error(tmp_path):
    """The real harness under `--profiler memory` on this CPU-only torch: it says why, in harness.json."""
    run_dir = RunDir(tmp_path)
    req = CaptureRequest(workload=TINY, run_dir=run_dir, python=sys.executable,
                         options=WorkloadOptions(train_step=True))
    command = harness_command(req, "memory", "memory")
    run_dir.pass_dir("memory").mkdir()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    result = json.loads(run_dir.harness_result("memory").read_text(encoding="utf-8"))
    assert done.returncode == 2, done.stderr
    assert result["error"]["kind"] == NO_CUDA and "sees no CUDA device" in result["error"]["message"]
    assert not run_dir.memory_snapshot().exists() and not run_dir.memory_record().exists()



@no_gpu
def test_profile_with_memory_on_a_cpu_profiles_and_says_why_there_is_no_memory_pass(tmp_path):
    req = ProfileRequest(workload=TINY, python=Interpreter(python=sys.executable), backend="torch",
                         output=tmp_path / "run", project=tmp_path, memory=True)
    result = api.profile(req)
    assert result.warnings[-1].startswith("no memory pass: it records the CUDA caching allocator")
    assert result.memory_path is None and not (tmp_path / "run" / "memory.json").exists()
    manifest = RunDir(tmp_path / "run").read_manifest()
    assert "--memory" in manifest.command_line and manifest.pass_named("memory") is None
