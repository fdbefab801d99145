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
from typing import Any

import anyio
import pytest
from conftest import REPO
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from mcp_server.children.contract import RUN_TAG_ENV
from mcp_server.schema.io import load_profile
from mcp_server.schema.manifest import RunOwner
from mcp_server.schema.recipes import RecipesReport

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


def test_2_a_signal_to_recipes_keeps_the_recipes_it_measured(work: Path):
    """Minutes of measurement are not lost to a stop: recipes.json holds the reference and the recipes that ended
    before the signal, says it was stopped, and names the rest as not run; no process of the run is left."""
    tag = uuid.uuid4().hex
    # the quick recipe first, then the stop during a compiling one (a default frontier compiles first, for minutes)
    proc = subprocess.Popen([*CLI, "recipes", "tiny_mlp.py", "-o", "frontier", "--jobs", "1", "--warmup", "2",
                             "--calls", "12", "--queued", "12", "--blocks", "2", "--input-sets", "2",
                             "--only", "eager+bf16-autocast,compile+fp32,compile+bf16-cast"],
                            cwd=work, env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # the first recipe after the reference has ended
        lines.append(line)
        if "recipes: [1/" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + err
    report = RecipesReport.model_validate_json((work / "frontier" / "recipes.json").read_text())
    assert report.stopped is not None and report.stopped.startswith("SIGTERM after ")
    ran = [r.recipe for r in report.results]
    assert "eager+fp32" in ran and len(ran) >= 2
    assert all(r.status == "ok" for r in report.results), "a recipe the stop killed is not a result"
    assert any(g.reason.startswith("not run: the run was stopped") for g in report.skipped)
    assert report.warnings[0].startswith("the run was stopped") and report.winners
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
    assert [p.name for p in (work / "mine").iterdir()] == ["notes.txt"], "a refused folder got a file of ours"


def test_5_a_failed_rerun_leaves_no_stale_profile(work: Path):
    assert cli(work, "profile", "tiny_mlp.py", "-o", "run", "-q").returncode == 0
    (work / "tiny_mlp.py").write_text((work / "tiny_mlp.py").read_text() + "\nraise RuntimeError('broken')\n")
    one_line_error(cli(work, "profile", "tiny_mlp.py", "-o", "run"), "RuntimeError: broken")
    assert not (work / "run" / "profile.json").exists()


# --------------------------------------------------------------------------------------------- bad values and files


@pytest.fixture(scope="module")
def profiled_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny_mlp profiled by the CLI once for the module (each profile costs seconds): its run directory."""
    folder = tmp_path_factory.mktemp("profiled")
    shutil.copy(TINY, folder / "tiny_mlp.py")
    assert cli(folder, "profile", "tiny_mlp.py", "-o", "run", "-q").returncode == 0
    return folder / "run"


@pytest.fixture()
def profiled(work: Path, profiled_once: Path) -> Path:
    """That run directory, copied into the working folder as `run`: its profile.json."""
    shutil.copytree(profiled_once, work / "run")
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
    one_line_error(cli(work, "profile", "folder.py", "-o", "r2"), "workload is a directory, not a .py file")
    one_line_error(cli(work, "profile", "broken.py", "-o", "r3"), "SyntaxError")
    one_line_error(cli(work, "profile", "wrong_return.py", "-o", "r4"), "must return (model, inputs)",
                   "it returned an int (42)")
    one_line_error(cli(work, "profile", "huge_alloc.py", "-o", "r5"), "during build")
    one_line_error(cli(work, "profile", "hang_forever.py", "--timeout", "5", "-o", "r6"), "ran past its 5 s limit")
    one_line_error(cli(work, "profile", "sys_exit.py", "-o", "r7"), "SystemExit: 3")
    for run in ("r1", "r2", "r3", "r4", "r5", "r6", "r7"):
        assert not (work / run / "profile.json").exists()


# --------------------------------------------------------------------------------------------- no survivor, the truth


def test_17_sigkill_of_the_cli_leaves_no_process_and_the_next_run_cleans_up(work: Path):
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*CLI, "profile", "hang_with_workers.py", "--timeout", "30"], cwd=work, env=_env(tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(_tagged(tag)) < 4 and time.monotonic() < deadline:  # the CLI, the harness, its worker, its daemon
        time.sleep(0.2)
    assert len(_tagged(tag)) >= 4, "the workload never started its worker and its daemon"
    proc.kill()  # SIGKILL: no handler runs, as when the OOM killer takes it
    proc.wait(timeout=30)
    _none_left(tag, grace_s=10.0)
    [stopped] = list((work / "op_runs").iterdir())
    assert json.loads((stopped / ".run.lock").read_text())["pid"] == proc.pid  # the record of a run that never ended
    assert "phase build" in (stopped / "torch" / "output.log").read_text()  # the log was on disk as it came

    after = cli(work, "profile", "tiny_mlp.py", "-q")  # its run directory beside the stopped one: reported, cleaned
    assert after.returncode == 0, after.stderr[-2000:]
    said = [ln for ln in after.stdout.splitlines() if ln.startswith("warning: ") and str(stopped) in ln]
    assert len(said) == 1 and f"(pid {proc.pid}, profile started" in said[0], after.stdout
    assert "was stopped before it finished" in said[0] and "partial output is kept" in said[0]
    assert (stopped / ".run.lock").read_text() == "" and not list(stopped.glob(".gpu*"))  # said once: cleared


def test_17_a_run_into_the_directory_of_a_killed_run_takes_it_over(work: Path):
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([*CLI, "profile", "hang_forever.py", "-o", "run"], cwd=work, env=_env(tag),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(_tagged(tag)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    proc.kill()
    proc.wait(timeout=30)
    _none_left(tag)
    again = cli(work, "profile", "hang_forever.py", "-o", "run", "--timeout", "3")
    one_line_error(again, "ran past its 3 s limit")
    assert f"a run in {work / 'run'} (pid {proc.pid}, profile started" in again.stderr
    assert "was stopped before it finished" in again.stderr


def test_17_what_a_stopped_run_left_running_is_stopped_by_the_next_run(work: Path):
    """The second line: a process of a dead engine's run still running (its bootstrap could not stop it) is found
    by the tag the run's lock recorded."""
    stopped = work / "op_runs" / "tiny_mlp-20260101-000000"
    stopped.mkdir(parents=True)
    token = "999999-0123abcd"
    (stopped / ".run.lock").write_text(RunOwner(pid=999999, tag=token, verb="profile",
                                                started_at="2026-01-01T00:00:00+00:00").model_dump_json())
    (stopped / ".gpu.lock").write_text("")
    survivor = subprocess.Popen(["sleep", "780"], env={**os.environ, RUN_TAG_ENV: f"{token}.3"},
                                start_new_session=True)
    try:
        after = cli(work, "profile", "tiny_mlp.py", "-q")
        assert survivor.wait(timeout=10) is not None
    finally:
        survivor.kill()
    said = [ln for ln in after.stdout.splitlines() if str(stopped) in ln]
    assert len(said) == 1 and f"stopped 1 of its processes still running ({survivor.pid} (sleep 780))" in said[0]
    assert "removed 1 scratch file(s)" in said[0] and not (stopped / ".gpu.lock").exists()


def test_18_a_daemon_the_workload_started_is_stopped_and_named(work: Path):
    proc = cli(work, "profile", "daemon.py", "-o", "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning: ") and "(sleep 777)" in ln]
    assert len(said) == 1 and "running outside its process group" in said[0] and "it was stopped" in said[0]
    assert "torch pass: stopped process" in proc.stderr and "(sleep 777)" in proc.stderr
    log = (work / "run" / "torch" / "output.log").read_text()
    assert "[operator-profiler] stopped process" in log and "(sleep 777)" in log
    manifest = json.loads((work / "run" / "manifest.json").read_text())
    assert [p["stopped_processes"] for p in manifest["passes"]][0][0].endswith("(sleep 777)")

    bench = cli(work, "bench", "daemon.py", "daemon.py", "-o", "bench", "--calls", "10", "--queued", "10",
                "--blocks", "1", "--budget-s", "0.1", "--warmup", "1", "--input-sets", "1")
    assert bench.returncode == 0, bench.stderr[-2000:]
    warnings = json.loads((work / "bench" / "bench.json").read_text())["warnings"]
    assert any("(sleep 777) running outside its process group" in w and "it was stopped" in w for w in warnings)


def test_19_the_log_holds_the_workloads_whole_traceback(work: Path):
    line = one_line_error(cli(work, "profile", "raises_in_forward.py", "-o", "run"),
                          "ValueError: scale must be positive, got -1", "during warmup")
    log_path = work / "run" / "torch" / "output.log"
    assert str(log_path) in line
    log = log_path.read_text()
    assert "Traceback (most recent call last)" in log
    for frame in ("in run_contract", "in forward", "in _check_scale"):  # the harness's frames down to the raise
        assert frame in log, frame
    assert "ValueError: scale must be positive, got -1" in log


@pytest.mark.parametrize("command, needles", [
    (["profile", "returns_string.py"], ("it returned a str ('model.pt')",)),
    (["profile", "returns_none.py"], ("it returned None",)),
    (["profile", "lambda_model.py"], ("its model is a function (a lambda), not a torch.nn.Module",
                                      "wrap it in an nn.Module")),
    (["bench", "tiny_mlp.py", "returns_none.py"], ("during build optimized", "it returned None")),
])
def test_20_a_malformed_return_is_named(work: Path, command: list[str], needles: tuple[str, ...]):
    one_line_error(cli(work, *command, "-o", "out"), "must return (model, inputs): a torch.nn.Module", *needles)


def _private_mounts() -> list[str] | None:
    """The unshare command that gives a child its own mount namespace here (as root, or mapped to root)."""
    unshare = shutil.which("unshare")
    for extra in ([] if os.geteuid() == 0 else None, ["--map-root-user"]):
        if unshare is None or extra is None:
            continue
        probe = subprocess.run([unshare, "--mount", *extra, "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [unshare, "--mount", *extra]
    return None


@pytest.mark.parametrize("size", ["20k", "28k"])  # the trace does not fit; the trace fits, the result does not
def test_21_a_full_disk_names_the_file_and_leaves_no_temporary_file(work: Path, size: str):
    unshare = _private_mounts()
    if unshare is None:
        pytest.skip("no private mount namespace here (unshare --mount): cannot give the run a small disk")
    disk, listing = work / "disk", work / "listing.txt"
    tag = uuid.uuid4().hex
    proc = subprocess.run(
        [*unshare, sys.executable, str(REPO / "tests" / "scripts" / "on_a_small_disk.py"), str(disk), size,
         str(listing), "--", *CLI, "profile", "tiny_mlp.py", "-o", str(disk / "run")],
        cwd=work, capture_output=True, text=True, timeout=180, env=_env(tag), check=False)
    _none_left(tag)
    line = one_line_error(proc, "could not write its results", "No space left on device",
                          f"free space on the disk holding {disk / 'run'}")
    assert str(disk / "run" / "torch") in line
    left = listing.read_text().split()
    assert not [name for name in left if name.endswith(".tmp")], left
    assert "run/profile.json" not in left


def _mcp(work: Path, calls: list[tuple[str, dict[str, Any]]], roots: list[Path] | None = None,
         **env: str) -> list[Any]:
    """Call tools on the real server over stdio, started in `work` (its project); the results in order. With
    `roots`, the client declares them (roots/list)."""
    async def listed(_context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=f"file://{p}") for p in roots or []])

    async def session() -> list[Any]:
        tag = uuid.uuid4().hex
        params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server"], cwd=str(work),
                                       env=_env(tag, CLAUDE_PROJECT_DIR=str(work), **env))
        async with stdio_client(params) as (read, write), \
                ClientSession(read, write, list_roots_callback=listed if roots else None) as session:
            await session.initialize()
            results = [await session.call_tool(name, args) for name, args in calls]
        _none_left(tag)
        return results

    return anyio.run(session)


def _text(result: Any) -> str:
    assert result.is_error, result.structured_content
    return str(result.content[0].text)


def _python_without_torch(folder: Path) -> Path:
    """An interpreter that has no torch: this one, without its site-packages."""
    bare = folder / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    return bare


def test_23_mcp_errors_speak_in_parameters_and_refuse_what_the_tool_does_not_take(work: Path, profiled: Path):
    bare = _python_without_torch(work)
    no_torch, quick, unknown, mistyped, passwd, option = _mcp(work, [
        ("profile", {"workload": "tiny_mlp.py", "python": str(bare), "output": "nt"}),
        ("preflight", {"python": str(bare), "quick": True}),
        ("top_operators", {"profile": "run", "limit": 3, "bogus": 1, "also": "x"}),
        ("top_operators", {"profile": "run", "limit": "many"}),
        ("analyze", {"profile": "/etc/passwd"}),
        ("profile", {"workload": "tiny_mlp.py", "nnodes": "-x"}),
    ])
    text = _text(no_torch)
    assert "cannot import torch" in text and "pass python=PATH to an interpreter that has torch" in text
    assert "--python" not in text

    assert not quick.is_error and quick.structured_content["ok"] is False
    [torch_check] = [c for c in quick.structured_content["checks"] if c["name"] == "torch"]
    assert torch_check["ok"] is False and "finds no torch" in torch_check["detail"]
    assert "python=PATH" in torch_check["remedy"] and "--python" not in quick.structured_content["summary"]

    assert _text(unknown) == ("Error executing tool top_operators: unknown parameters also, bogus — top_operators "
                              "takes profile, limit")
    text = _text(mistyped)
    assert "limit: input should be a valid integer" in text and "(got 'many')" in text
    assert "\n" not in text and "pydantic" not in text and "http" not in text

    text = _text(passwd)
    assert "/etc/passwd is outside the folders this server may read and write" in text
    assert f"({work})" in text and "OPERATOR_PROFILER_ALLOWED_DIRS" in text and "valid JSON" not in text

    assert _text(option) == ("Error executing tool profile: nnodes: '-x' looks like a command-line option, not a "
                             "plain value — pass a valid value (see the tool's parameters)")


def test_24_the_folders_widen_with_the_setting_and_the_clients_roots(work: Path, profiled: Path, tmp_path: Path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(work / "run", elsewhere / "run")
    [passwd] = _mcp(work, [("analyze", {"profile": "/etc/passwd"})], OPERATOR_PROFILER_ALLOWED_DIRS="/etc")
    assert "/etc/passwd is not valid JSON" in _text(passwd)  # allowed, then read: it is no profile
    outside, = _mcp(work, [("top_operators", {"profile": str(elsewhere / "run")})])
    assert "is outside the folders" in _text(outside)
    inside, = _mcp(work, [("top_operators", {"profile": str(elsewhere / "run")})], roots=[elsewhere])
    assert not inside.is_error and inside.structured_content["operators"]


def test_22_a_cpu_window_mostly_outside_operators_says_so_and_shows_its_spread(work: Path):
    proc = cli(work, "profile", "pool_in_forward.py", "-o", "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("warning: the window lasted")]
    assert len(said) == 1 and "most of the window runs outside operators" in said[0], proc.stdout
    assert "shares are shares of operator time, not of the window" in said[0]
    assert "op share: of the operators' CPU total time, not of the window" in proc.stdout
    window = load_profile(work / "run" / "profile.json").window
    assert window.unprofiled_windows and window.unprofiled_windows >= 2 and window.unprofiled_wall_time_range_ns
    low, high = window.unprofiled_wall_time_range_ns
    assert low <= (window.unprofiled_wall_time_ns or 0) <= high
    assert f"median over {window.unprofiled_windows} windows" in proc.stdout
    assert f"the fastest of {window.unprofiled_windows} windows without the profiler" in said[0]

    analyzed = cli(work, "analyze", "run", "-o", "an")
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    assert "outside torch operators (Python code, other processes, waiting): start there" in analyzed.stdout
    diagnosis = json.loads((work / "an" / "analysis.json").read_text())["diagnosis"]
    assert any(t.startswith("operator_time_pct=") for t in diagnosis["triggers"])

    # a window spent in its operators: no warning. One intra-op thread, so that a test running beside this one on
    # a two-core machine cannot stretch every window through OpenMP's barriers (a 0.6 ms window was timed at 28 ms)
    tiny = cli(work, "profile", "tiny_mlp.py", "-o", "tiny", "-q", OMP_NUM_THREADS="1")
    assert tiny.returncode == 0 and "warning: the window lasted" not in tiny.stdout
    assert load_profile(work / "tiny" / "profile.json").window.unprofiled_windows == 5
