"""Fault injection: the real CLI (and the real MCP server over stdio) as child processes against hostile
workloads and bad input. For each case: its exit status, one error line with a remedy, no traceback, no
partial or foreign profile.json, no process of the run left running, nothing written outside its output.

Every run carries a tag in its environment; the process table is searched for it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest
from conftest import REPO
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_server.schema.io import load_profile

HOSTILE = REPO / "tests" / "hostile"
TINY = REPO / "tests" / "workloads" / "tiny_mlp.py"
TAG = "OPERATOR_PROFILER_FAULT_TAG"
# The console script, as a user runs it (`python -m` would put the working folder, and its workloads, on sys.path).
CLI = [str(Path(sys.executable).with_name("operator-profiler"))]


# --------------------------------------------------------------------------------------------- harness


@pytest.fixture()
def work(tmp_path: Path) -> Path:
    """An empty working folder; the hostile workloads copied into it."""
    folder = tmp_path / "work"
    shutil.copytree(HOSTILE, folder)
    shutil.copy(TINY, folder / "tiny_mlp.py")
    for name in ("tiny_mlp_optimized.py", "tiny_passes.py"):
        shutil.copy(TINY.with_name(name), folder / name)
    return folder


def _env(tag: str, **extra: str) -> dict[str, str]:
    return {**os.environ, TAG: tag, "OPERATOR_PROFILER_EXAMPLE_SCALE": "small", **extra}


def _tagged(tag: str) -> list[int]:
    """Processes whose environment carries `tag` (the run's children, if any survived)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"{TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _none_left(tag: str, grace_s: float = 10.0) -> None:
    deadline = time.monotonic() + grace_s
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _tagged(tag), "processes of the run are still running"


def cli(work: Path, *args: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in `work`; afterwards no process of the run may be left."""
    tag = uuid.uuid4().hex
    proc = subprocess.run([*CLI, *args], cwd=work, capture_output=True, text=True,
                          timeout=timeout, env=_env(tag, **env), check=False)
    _none_left(tag)
    return proc


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str, code: int = 1) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("operator-profiler: error:")]
    assert len(errors) == 1 and " — " in errors[0], proc.stderr[-2000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def only(work: Path, *names: str) -> None:
    """Nothing but `names` (and the hostile workloads) was written in the working folder."""
    copied = {"tiny_mlp.py", "tiny_mlp_optimized.py", "tiny_passes.py", "__pycache__"}
    expected = {p.name for p in HOSTILE.iterdir()} | copied | set(names)
    assert {p.name for p in work.iterdir()} <= expected, sorted({p.name for p in work.iterdir()} - expected)


# --------------------------------------------------------------------------------------------- crashes, lost work


def test_1_workers_holding_stdout_open_do_not_crash_the_capture(work: Path):
    proc = cli(work, "profile", "dataloader_workers.py", "-o", "run", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert load_profile(work / "run" / "profile.json").operators
    only(work, "run")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_2_a_signal_to_the_cli_stops_its_workload(work: Path, signum: int):
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*CLI, "profile", "hang_forever.py", "-o", "run"],
                            cwd=work, env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_tagged(tag)) < 2 and time.monotonic() < deadline:  # the CLI and its workload
        time.sleep(0.2)
    time.sleep(2)  # the workload is inside get_model_and_input
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum
    assert f"stopped by {signal.Signals(signum).name}; its child processes were stopped" in err
    _none_left(tag)


def test_2_a_signal_to_bench_stops_its_child(work: Path):
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*CLI, "bench", "tiny_mlp.py", "hang_forever.py",
                             "-o", "bench"], cwd=work, env=_env(tag), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_tagged(tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    _none_left(tag)


def test_3_the_time_limit_holds_against_endless_output_and_the_log_is_capped(work: Path):
    tag = uuid.uuid4().hex
    # stderr goes to a pipe nobody reads: the CLI's own progress must not hold up the time limit
    proc = subprocess.Popen([*CLI, "profile", "print_forever.py", "--timeout", "8",
                             "-o", "run", "--verbose"], cwd=work, env=_env(tag, OPERATOR_PROFILER_LOG_LIMIT_MB="2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 40
        while len(_tagged(tag)) > 1 and time.monotonic() < deadline:  # the workload stopped; the CLI may wait
            time.sleep(0.5)
        assert _tagged(tag) in ([], [proc.pid]), "the workload outlived its time limit"
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"ran past its 8 s limit" in err
    log = work / "run" / "torch" / "output.log"
    assert 2 * 1024 * 1024 <= log.stat().st_size < 3 * 1024 * 1024
    assert "more were dropped" in log.read_text()[-300:]
    assert not (work / "run" / "profile.json").exists()
    _none_left(tag)


@pytest.mark.parametrize("workload, needles", [
    ("killed.py", ("was killed by SIGKILL", "out of memory")),
    ("exits.py", ("exited with code 3",)),
])
def test_4_a_killed_workload_says_how_it_ended_and_the_manifest_keeps_the_pass(work: Path, workload, needles):
    line = one_line_error(cli(work, "profile", workload, "-o", "run"), *needles)
    assert "output.log" in line or "last lines" in line
    passes = json.loads((work / "run" / "manifest.json").read_text())["passes"]
    assert len(passes) == 1 and passes[0]["exit_code"] != 0 and passes[0]["notes"]
    assert not (work / "run" / "profile.json").exists()


def test_4_an_interpreter_that_is_not_python(work: Path):
    one_line_error(cli(work, "profile", "tiny_mlp.py", "--python", "/bin/false", "-o", "run"),
                   "exited with code 1", "check that /bin/false is a Python interpreter")


# --------------------------------------------------------------------------------------------- run directories


def test_5_a_run_directory_in_use_or_holding_another_run_is_refused(work: Path):
    tag = uuid.uuid4().hex
    first = subprocess.Popen([*CLI, "profile", "hang_forever.py", "-o", "run"],
                             cwd=work, env=_env(tag), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "run"), "is in use by another run")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    _none_left(tag)
    one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "run"), "holds a run of", "hang_forever.py")
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("mine")
    one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "mine"), "is not empty and holds no run")
    assert (work / "mine" / "notes.txt").read_text() == "mine"


def test_5_a_failed_rerun_leaves_no_stale_profile(work: Path):
    assert cli(work, "profile", "tiny_mlp.py", "-o", "run", "-q").returncode == 0
    (work / "tiny_mlp.py").write_text((work / "tiny_mlp.py").read_text() + "\nraise RuntimeError('broken')\n")
    one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "run"), "RuntimeError: broken")
    assert not (work / "run" / "profile.json").exists()


# --------------------------------------------------------------------------------------------- bad values and files


@pytest.fixture()
def profiled(work: Path) -> Path:
    assert cli(work, "profile", "tiny_mlp.py", "-o", "run", "-q").returncode == 0
    return work / "run" / "profile.json"


@pytest.mark.parametrize("command", [
    ["analyze", "run/profile.json"], ["compare", "run/profile.json", "run/profile.json"],
    ["report", "run/profile.json"], ["bench", "tiny_mlp.py", "tiny_mlp.py"],
    ["validate", "tiny_mlp.py", "tiny_mlp.py"],
])
def test_6_an_output_path_that_is_a_file(work: Path, profiled: Path, command: list[str]):
    (work / "blocker").write_text("x")
    one_line_error(cli(work, *command, "-o", "blocker/out"), "cannot write to output directory")


def test_6_bad_files_and_values(work: Path, profiled: Path):
    one_line_error(cli(work, "validate", "tiny_mlp.py", "tiny_mlp.py", "--seeds", "a,b"), "--seeds 'a,b'")
    (work / "binary.json").write_bytes(bytes(range(256)) * 4)
    one_line_error(cli(work, "report", "run/profile.json", "--optimizations", "binary.json"), "not UTF-8 text")
    (work / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(cli(work, "summary", "deep.json"), "deep.json")
    one_line_error(cli(work, "analyze", "x" * 100_000 + ".json"), "characters")


def test_6_the_mcp_server_answers_bad_paths_and_bytes_with_a_remedy(work: Path, profiled: Path):
    (work / "latin1.json").write_bytes("{\"é\": 1}".encode("latin-1"))

    async def calls() -> list[str]:
        tag = uuid.uuid4().hex
        params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server"], cwd=str(work),
                                       env=_env(tag, CLAUDE_PROJECT_DIR=str(work)))
        texts = []
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            for name, args in (("analyze", {"profile": "y" * 100_000}),
                               ("report", {"baseline_profile": "run", "bench_json": "latin1.json"}),
                               ("validate", {"baseline": "tiny_mlp.py", "optimized": "tiny_mlp.py",
                                             "bench_json": "latin1.json", "run_tests": False})):
                result = await session.call_tool(name, args)
                assert result.is_error
                texts.append(result.content[0].text)
        _none_left(tag)
        return texts

    for text in anyio.run(calls):  # the SDK puts "Error executing tool X: " before the message
        message = text.split(": ", 1)[-1]
        assert " — " in message and "Traceback" not in text, text


def test_7_profiles_of_two_different_models_are_not_compared(work: Path, profiled: Path):
    assert cli(work, "profile", "other_mlp.py", "-o", "other", "-q").returncode == 0
    one_line_error(cli(work, "compare", "run/profile.json", "other/profile.json", "-o", "cmp"),
                   "these look like different models", "--allow-mismatch")


@pytest.mark.parametrize("flags, needle, code", [
    (["--timeout", "nan"], "--timeout: input should be a finite number", 1),
    (["--timeout", "0"], "--timeout: input should be greater than 0", 1),
    (["--timeout", "-5"], "--timeout: input should be greater than 0", 1),
    (["--iters", "0"], "--iters: input should be greater than or equal to 1", 1),
    (["--iters", "abc"], "argument --iters: invalid int value: 'abc'", 2),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag", 2),
])
def test_8_bad_counts_and_limits(work: Path, flags: list[str], needle: str, code: int):
    one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "run", *flags), needle, code=code)
    assert not (work / "run").exists()


@pytest.mark.parametrize("name", ["copy", "torch", "inspect"])
def test_9_a_workload_named_like_a_module(work: Path, name: str):
    shutil.copy(work / "tiny_mlp.py", work / f"{name}.py")
    one_line_error(cli(work, "profile", f"{name}.py", "-o", "run"), f"is the name of the module `{name}`",
                   "rename the file")


# --------------------------------------------------------------------------------------------- first contact


def test_11_defaults_write_a_fresh_folder_with_the_umask_permissions(work: Path, profiled: Path):
    proc = cli(work, "validate", "tiny_mlp.py", "tiny_mlp_optimized.py", "--seeds", "0", "--no-tests", "-q")
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert cli(work, "compare", "run/profile.json", "run/profile.json").returncode == 0
    written = [p for p in (work / "op_runs").rglob("*") if p.is_file()]
    assert any(p.name == "validation_report.json" for p in written) and any(p.name == "comparison.json"
                                                                           for p in written)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~_umask() for p in written if p.suffix == ".json")
    only(work, "run", "op_runs")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_12_preflight_on_a_cpu_machine_says_what_works(work: Path):
    proc = cli(work, "preflight")
    assert proc.returncode == 0 and "[FAIL]" not in proc.stdout, proc.stdout
    assert "[ok  ] torch" in proc.stdout and "backend auto -> torch.profiler" in proc.stdout


def test_13_a_cpu_inductor_profile_keeps_the_generated_kernels(work: Path):
    proc = cli(work, "profile", "tiny_mlp.py", "--compile-mode", "inductor", "-o", "run", "-q", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = load_profile(work / "run" / "profile.json")
    fused = [op for op in profile.operators if op.operator_name.startswith("cpp_fused_")]
    assert fused and all(op.is_fused and op.fused_operators for op in fused)
    assert any(op.operator_name == "aten::addmm" and op.module_path for op in profile.operators)


def test_15_summary_takes_a_run_directory(work: Path, profiled: Path):
    proc = cli(work, "summary", "run")
    assert proc.returncode == 0 and "aten::linear" in proc.stdout


def test_16_progress_shows_phases_not_the_workloads_output(work: Path):
    proc = cli(work, "profile", "chatty.py", "-o", "run")
    assert proc.returncode == 0
    assert "[operator-profiler] torch pass: measure" in proc.stderr and "yyyy" not in proc.stderr
    assert "yyyy" in (work / "run" / "torch" / "output.log").read_text(encoding="utf-8")[:5000]


def test_already_handled_inputs_stay_one_line_errors(work: Path):
    (work / "broken.py").write_text("def get_model_and_input()\n    return None\n")
    (work / "sys_exit.py").write_text("import sys\n\n\ndef get_model_and_input():\n    sys.exit(3)\n")
    (work / "folder.py").mkdir()
    one_line_error(cli(work, "profile", "missing.py", "-o", "r1"), "workload not found")
    one_line_error(cli(work, "profile", "folder.py", "-o", "r2"), "workload not found")
    one_line_error(cli(work, "profile", "broken.py", "-o", "r3"), "SyntaxError")
    one_line_error(cli(work, "profile", "wrong_return.py", "-o", "r4"), "during build")
    one_line_error(cli(work, "profile", "huge_alloc.py", "-o", "r5"), "during build")
    one_line_error(cli(work, "profile", "hang_forever.py", "--timeout", "5", "-o", "r6"), "ran past its 5 s limit")
    one_line_error(cli(work, "profile", "sys_exit.py", "-o", "r7"), "SystemExit: 3")
    for run in ("r1", "r2", "r3", "r4", "r5", "r6", "r7"):
        assert not (work / run / "profile.json").exists()
