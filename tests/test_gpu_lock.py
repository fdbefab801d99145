"""The GPU lock protocol between the passes of `run`: a pass builds its model at once but compiles and warms
up only after the previous pass's window is done (at once when nothing in its warm-up autotunes and it is asked
to), and no window shares the GPU with another pass's build or warm-up."""

from __future__ import annotations

import fcntl
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from conftest import EXAMPLES

from mcp_server.children.contract import PHASE_MARKER
from mcp_server.process import child_script

SCRIPTS = Path(__file__).parent / "scripts"
WORKLOADS = Path(__file__).parent / "workloads"
HARNESS = child_script("harness")

BLOCKED_S = 6  # longer than the CPU harness needs to build, warm up and measure mlp_activations


def _harness(run_dir, *lock_args, workload=EXAMPLES / "mlp_activations" / "mlp_activations.py"):
    return subprocess.Popen(
        [sys.executable, str(HARNESS), "--workload", str(workload),
         "--run-dir", str(run_dir), "--result", str(run_dir / "harness.json"), "--profiler", "none",
         "--warmup-iters", "1", *lock_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _result(run_dir) -> dict:
    path = run_dir / "harness.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _stop(*procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_pass_measures_after_the_first(tmp_path):
    lock, done = tmp_path / ".gpu.lock", tmp_path / ".gpu.done"
    second = _harness(tmp_path / "second", "--gpu-lock", str(lock), "--gpu-lock-after", str(done))
    try:
        time.sleep(BLOCKED_S)
        assert second.poll() is None, "the second pass must not start before the first pass's window is done"
        assert _result(tmp_path / "second").get("status") != "ok"
        first = _harness(tmp_path / "first", "--gpu-lock", str(lock), "--gpu-lock-done", str(done))
        assert first.wait(timeout=120) == 0
        assert done.exists(), "the first pass marks its window done"
        assert second.wait(timeout=120) == 0
    finally:
        _stop(second)
    first_result, second_result = _result(tmp_path / "first"), _result(tmp_path / "second")
    assert first_result["status"] == second_result["status"] == "ok"
    assert first_result["finished_at"] <= second_result["finished_at"]
    first_at, second_at = first_result["phase_started_at"], second_result["phase_started_at"]
    assert second_at["build"] < first_at["measure"], "the second pass builds while the first one still runs"
    assert second_at["warmup"] >= done.stat().st_mtime - 0.01, "it warms up only after the first pass's window"


def test_a_window_waits_for_the_other_pass_to_finish_warming_up(tmp_path):
    lock = tmp_path / ".gpu.lock"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_SH)  # another pass building or warming up
        first = _harness(tmp_path / "first", "--gpu-lock", str(lock), "--gpu-lock-done", str(tmp_path / ".gpu.done"))
        try:
            time.sleep(BLOCKED_S)
            assert first.poll() is None, "the window must wait while another pass warms up"
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            assert first.wait(timeout=120) == 0
        finally:
            _stop(first)
    assert _result(tmp_path / "first")["status"] == "ok"
    assert (tmp_path / ".gpu.done").exists()


def test_warm_up_waits_while_another_pass_measures(tmp_path):
    lock = tmp_path / ".gpu.lock"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another pass in its window
        first = _harness(tmp_path / "first", "--gpu-lock", str(lock))
        try:
            time.sleep(BLOCKED_S)
            assert first.poll() is None, "building and warming up must wait while another pass measures"
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            assert first.wait(timeout=120) == 0
        finally:
            _stop(first)
    result = _result(tmp_path / "first")
    assert result["status"] == "ok" and result["window"]["wall_time_ns"] > 0


def test_a_script_builds_under_the_lock_and_measures_after_the_previous_pass(tmp_path):
    lock, done = tmp_path / ".gpu.lock", tmp_path / ".gpu.done"
    with open(lock, "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # another pass in its window
        script = _harness(tmp_path / "script", "--gpu-lock", str(lock), "--gpu-lock-after", str(done),
                          workload=SCRIPTS / "script_window.py")
        try:
            time.sleep(BLOCKED_S)
            assert script.poll() is None, "the script's own build waits while another pass measures"
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            time.sleep(1)
            assert script.poll() is None, "its window waits for the previous pass's done file"
            done.touch()
            assert script.wait(timeout=120) == 0
        finally:
            _stop(script)
    result = _result(tmp_path / "script")
    assert result["status"] == "ok" and result["workload_kind"] == "script"
    with open(lock, "a+") as probe:  # nothing still holds the lock
        fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_only_a_pass_asked_to_imports_the_compiler_before_its_first_cuda_call(tmp_path):
    def phases(run_dir, *extra):
        proc = subprocess.run(
            [sys.executable, str(HARNESS), "--workload", str(EXAMPLES / "mlp_activations" / "mlp_activations.py"),
             "--run-dir", str(run_dir), "--result", str(run_dir / "harness.json"),
             "--provenance", str(run_dir / "prov.json"), "--profiler", "none", "--warmup-iters", "1",
             "--compile-mode", "inductor", *extra],
            capture_output=True, text=True, timeout=300, check=False,
        )
        assert proc.returncode == 0, proc.stdout[-2000:]
        return list(_result(run_dir)["phase_started_at"])

    early = phases(tmp_path / "early", "--import-compiler-early")
    assert early[:3] == ["import", "compiler import", "setup"], "imported before setup's first CUDA call"
    assert "compiler import" not in phases(tmp_path / "lazy")


def test_an_eager_pass_warms_up_beside_the_previous_pass_unless_cudnn_autotunes(tmp_path):
    for workload, early in ((WORKLOADS / "tiny_mlp.py", True), (WORKLOADS / "tiny_mlp_cudnn_autotuned.py", False)):
        run_dir = tmp_path / workload.stem
        after = run_dir / ".gpu.previous-done"
        run_dir.mkdir()
        proc = subprocess.Popen(
            [sys.executable, str(HARNESS), "--workload", str(workload), "--run-dir", str(run_dir),
             "--result", str(run_dir / "harness.json"), "--profiler", "none", "--warmup-iters", "1",
             "--gpu-lock", str(run_dir / ".gpu.lock"), "--gpu-lock-after", str(after), "--warm-up-early"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        try:
            _wait_for_phase(proc, "waiting for the GPU lock (window)" if early else "waiting for the previous pass")
            time.sleep(1)
            assert proc.poll() is None, f"{workload.name} waits for the previous pass's window"
            previous_done = time.time()
            after.touch()
            assert proc.wait(timeout=120) == 0
        finally:
            _stop(proc)
        result = _result(run_dir)
        marks = result["phase_started_at"]  # rounded to the millisecond
        assert result["warmed_up_early"] is early
        assert result["cudnn_benchmark"] is not early, "harness.json says whether cuDNN's autotuner was on"
        if early:
            assert marks["warmup"] <= previous_done + 0.001, "eager, cuDNN's autotuner off: it warmed up at once"
        else:
            assert marks["warmup"] >= previous_done - 0.01, "the autotuner on: it warmed up after the previous window"
        assert marks["measure"] >= previous_done - 0.01, "its window came after the previous pass's"


def _wait_for_phase(proc: subprocess.Popen, phase: str, timeout_s: float = 120.0) -> None:
    """Read the harness's output until it enters `phase` (or fail once `timeout_s` have passed). The pipe is read
    raw: a buffered readline would leave lines that arrived together in its buffer, unseen by the selector."""
    assert proc.stdout is not None
    fd, pending = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.5):
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            if any(line.decode(errors="replace").strip() == PHASE_MARKER + phase for line in lines):
                return
    raise AssertionError(f"the harness never entered {phase!r}")



def test_a_pass_runs_on_its_cpu_share_and_says_so(tmp_path):
    own = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True).stdout)
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--workload", str(WORKLOADS / "thread_count.py"), "--run-dir", str(tmp_path),
         "--result", str(tmp_path / "harness.json"), "--profiler", "none", "--warmup-iters", "2",
         "--gpu-lock", str(tmp_path / ".gpu.lock"), "--cpu-threads", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    before, _, window = proc.stdout.partition(f"{PHASE_MARKER}measure")
    assert "threads build 1" in before and before.count("threads call 1") == 2, "built and warmed up on its share"
    assert "threads call 1" in window, "and measured on it"
    expected = {"own": own, "share": 1} if own > 1 else None
    assert _result(tmp_path)["cpu_threads"] == expected, "the result says what the share changed"
