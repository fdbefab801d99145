"""The plugin's hook scripts on sample payloads: real child processes, real files, fail-open behaviour.

Each script is run the way Claude Code runs it (stdin JSON in, JSON or nothing out, exit 0), with
CLAUDE_PLUGIN_ROOT set to the repository. The engine is this test's interpreter (it has the package's
dependencies); `python -S` (no site-packages) stands for a machine where the engine is not installed yet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

HOOKS = REPO / "hooks"
MCP = "mcp__plugin_operator-profiler_operator-profiler__"


def run_hook(script: str, payload: object, tmp_path: Path, no_site: bool = False,
             path: str | None = None) -> tuple[int, dict | None, str]:
    """Run a hook script with `payload` on stdin; (exit code, parsed JSON answer or None, stderr)."""
    env = {**os.environ, "CLAUDE_PLUGIN_ROOT": str(REPO), "CLAUDE_PLUGIN_DATA": str(tmp_path / "plugin-data")}
    if path is not None:
        env["PATH"] = path
    stdin = payload if isinstance(payload, str) else json.dumps(payload)
    cmd = [sys.executable, *(["-S"] if no_site else []), str(HOOKS / script)]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    out = proc.stdout.strip()
    return proc.returncode, (json.loads(out) if out else None), proc.stderr


def _context(answer: dict | None) -> str:
    assert answer is not None, "the hook said nothing"
    return answer["hookSpecificOutput"]["additionalContext"]


def _write_payload(path: Path, tmp_path: Path, tool: str = "Write") -> dict:
    return {"hook_event_name": "PostToolUse", "tool_name": tool, "cwd": str(tmp_path),
            "tool_input": {"file_path": str(path), "content": "..."}, "tool_response": {"success": True}}


@pytest.fixture()
def profile_file(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real profile.json (assembled from the recorded conv_block eager run) in a workload folder."""
    from test_render import assembled_profile

    target = tmp_path / "conv_block" / "profile.json"
    target.parent.mkdir()
    shutil.copy(assembled_profile("conv_block_eager", tmp_path / "fixture", tmp_path_factory), target)
    return target


def test_session_start_reports_the_quick_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPERATOR_PROFILER_PYTHON", sys.executable)  # the workloads' interpreter: it has torch
    code, answer, _ = run_hook("session_start.py", {"hook_event_name": "SessionStart", "source": "startup"},
                               tmp_path)
    assert code == 0
    context = _context(answer)
    assert context.startswith("Operator Profiler quick preflight: all checks passed.")
    assert f"torch              found at {Path(__import__('torch').__file__).parent}" in context
    assert "backend auto -> " in context and "nsys" in context and "ncu" in context
    assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"


def test_session_start_names_uv_when_it_is_missing(tmp_path: Path) -> None:
    bare = tmp_path / "bin"  # a PATH without uv
    bare.mkdir()
    code, answer, stderr = run_hook("session_start.py", {"source": "startup"}, tmp_path, path=str(bare))
    assert code == 0 and stderr == ""
    context = _context(answer)
    assert context.startswith("Operator Profiler quick preflight:")  # what it could check, then what is missing
    assert "`uv` is not on PATH" in context and "https://astral.sh/uv/install.sh" in context


def test_session_start_fails_open_without_the_engine(tmp_path: Path) -> None:
    code, answer, stderr = run_hook("session_start.py", {"source": "startup"}, tmp_path, no_site=True)
    assert code == 0 and stderr == ""
    assert "not ready yet" in _context(answer)


@pytest.mark.parametrize("script", ["session_start.py", "post_tool_use.py"])
def test_hooks_fail_open_on_garbage_stdin(script: str, tmp_path: Path) -> None:
    code, answer, stderr = run_hook(script, "{not json", tmp_path)
    assert code == 0 and stderr == ""
    if script == "post_tool_use.py":
        assert answer is None


def test_profile_written_gets_coverage_and_next_step(profile_file: Path, tmp_path: Path) -> None:
    code, answer, _ = run_hook("post_tool_use.py", _write_payload(profile_file, tmp_path), tmp_path)
    assert code == 0
    context = _context(answer)
    assert "profile.json written: NVIDIA H200 (nsys+ncu, eager), 23 kernels, 100.0 % of kernel time attributed" \
        in context
    assert "Next: analyze it" in context and "CPU-only" not in context and "map tool" not in context
    assert "decision" not in answer


def test_cpu_profile_with_missing_counters_is_flagged(profile_file: Path, tmp_path: Path) -> None:
    data = json.loads(profile_file.read_text())
    data["capture_metadata"]["gpu_used"] = False
    data["window"]["kernels_with_counters"] = 20
    data["window"]["attributed_kernel_time_pct"] = 90.0
    copy = profile_file.with_name("profile_optimized.json")
    copy.write_text(json.dumps(data))
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(copy, tmp_path, "Edit"), tmp_path)
    context = _context(answer)
    assert "CPU-only profile" in context
    assert "Attribution below 99 %" in context
    assert "Only 20/23 kernels carry ncu counters" in context


def test_profile_found_in_an_mcp_tool_result(profile_file: Path, tmp_path: Path) -> None:
    payload = {"tool_name": f"{MCP}profile", "cwd": str(tmp_path), "tool_input": {"workload": "w.py"},
               "tool_response": {"structuredContent": {"profile_path": str(profile_file), "run_dir": "x"}}}
    _, answer, _ = run_hook("post_tool_use.py", payload, tmp_path)
    assert "23 kernels" in _context(answer)


def test_the_loop_status_result_names_files_but_nudges_nothing(profile_file: Path, tmp_path: Path) -> None:
    payload = {"tool_name": f"{MCP}loop_status", "cwd": str(tmp_path), "tool_input": {"workload": "w.py"},
               "tool_response": {"structuredContent": {"checkpoints": [{"path": str(profile_file)}]}}}
    assert run_hook("post_tool_use.py", payload, tmp_path)[1] is None


def test_profile_copied_with_bash_cp(profile_file: Path, tmp_path: Path) -> None:
    payload = {"tool_name": "Bash", "cwd": str(tmp_path),
               "tool_input": {"command": f"cp op_runs/run/profile.json {profile_file.relative_to(tmp_path)}"}}
    _, answer, _ = run_hook("post_tool_use.py", payload, tmp_path)
    assert _context(answer).count("profile.json written") == 1
    payload["tool_input"]["command"] = f"cat {profile_file}"
    assert run_hook("post_tool_use.py", payload, tmp_path)[1] is None


def test_invalid_optimizations_json_is_sent_back(tmp_path: Path) -> None:
    path = tmp_path / "optimizations.json"
    path.write_text(json.dumps({"workload": "w.py", "baseline_profile": "profile.json", "created_at": "now",
                                "items": []}))
    code, answer, _ = run_hook("post_tool_use.py", _write_payload(path, tmp_path), tmp_path)
    assert code == 0
    assert answer["decision"] == "block"
    assert "optimizations.schema.json" in answer["reason"] and "items" in answer["reason"]


def test_valid_optimizations_json_gets_next_step(tmp_path: Path) -> None:
    from test_render import sample_plan

    path = tmp_path / "optimizations.json"
    plan = sample_plan("examples/conv_block/conv_block.py")
    proposed = plan.model_copy(update={"items": [i.model_copy(update={"status": "proposed", "status_reason": None})
                                                 for i in plan.items]})
    path.write_text(proposed.model_dump_json())
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(path, tmp_path), tmp_path)
    assert "decision" not in answer
    context = _context(answer)
    assert context.startswith("valid ") and "2 item(s)" in context and "plan mode" in context
    # once the implement stage has recorded its statuses, the brief is not rendered again: validate is next
    path.write_text(plan.model_dump_json())
    context = _context(run_hook("post_tool_use.py", _write_payload(path, tmp_path), tmp_path)[1])
    assert "plan mode" not in context and "Next: validate" in context


def test_optimizations_json_without_the_engine_is_only_parsed(tmp_path: Path) -> None:
    path = tmp_path / "optimizations.json"
    path.write_text(json.dumps({"items": []}))
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(path, tmp_path), tmp_path, no_site=True)
    assert "schema check needs the engine" in _context(answer)


def test_optimized_workload_contract_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "tiny_mlp_optimized.py"
    shutil.copy(REPO / "tests" / "workloads" / "tiny_mlp_optimized.py", good)
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(good, tmp_path), tmp_path)
    assert "write its test test_tiny_mlp_optimized.py next" in _context(answer)
    shutil.copy(REPO / "tests" / "workloads" / "test_tiny_mlp_optimized.py", tmp_path)
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(good, tmp_path), tmp_path)
    assert "Next: run test_tiny_mlp_optimized.py with pytest" in _context(answer)

    bad = tmp_path / "conv_optimized.py"
    bad.write_text("import torch\n\ndef get_model_and_input():\n    return None\n")
    _, answer, _ = run_hook("post_tool_use.py", _write_payload(bad, tmp_path), tmp_path)
    assert answer["decision"] == "block"
    for name in ("BACKEND_NAME", "a registered backend", "APPLIED_PASSES", "optimize(model)"):
        assert name in answer["reason"]
    assert "get_model_and_input" not in answer["reason"].split("lacks", 1)[1].split("required")[0]


def test_unrelated_files_get_no_answer(tmp_path: Path) -> None:
    other = tmp_path / "notes.md"
    other.write_text("x")
    test_file = tmp_path / "test_x_optimized.py"
    test_file.write_text("x")
    for path in (other, test_file, tmp_path / "missing_optimized.py"):
        code, answer, _ = run_hook("post_tool_use.py", _write_payload(path, tmp_path), tmp_path)
        assert code == 0 and answer is None


def test_hooks_json_wires_the_scripts_with_timeouts_in_seconds() -> None:
    config = json.loads((HOOKS / "hooks.json").read_text())["hooks"]
    commands = {h["command"]: h["timeout"] for event in config.values() for group in event for h in group["hooks"]}
    assert set(config) == {"SessionStart", "PostToolUse"}
    for command, timeout in commands.items():
        script = command.split("hooks/")[1].rstrip('"')
        assert (HOOKS / script).is_file() and "${CLAUDE_PLUGIN_ROOT}" in command
        assert 1 <= timeout <= 60, "hook timeouts are seconds"
    for script in HOOKS.glob("*.py"):
        assert len(script.read_text().splitlines()) <= 80, f"{script.name} should stay a small script"
