"""A pass that compiles early (alongside the previous pass) may only reuse Inductor's cache: a graph the cache
lacks stops it before that graph runs; with every graph cached it compiles and warms up at once, and only its
window waits for the previous pass's."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import time

import pytest
from conftest import EXAMPLES

from mcp_server.capture.passes import NotCached, run_pass
from mcp_server.capture.request import CaptureRequest
from mcp_server.process import child_script
from mcp_server.rundir import RunDir

HARNESS = child_script("harness")

WORKLOAD = EXAMPLES / "mlp_activations" / "mlp_activations.py"


def _request(run_dir, early: bool) -> CaptureRequest:
    return CaptureRequest(workload=WORKLOAD, run_dir=RunDir(run_dir), compile_mode="inductor", warmup_iters=1,
                          warm_up_early=early)


def test_early_compile_stops_on_a_cold_cache_and_runs_from_a_warm_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    with pytest.raises(NotCached, match="did not hold a graph"):
        run_pass(_request(tmp_path / "cold", early=True), "timing", "none")
    cold = json.loads((tmp_path / "cold" / "timing" / "harness.json").read_text())
    assert cold["error"]["kind"] == "not_cached"
    assert "measure" not in cold["phase_started_at"], "nothing of the uncached graph ran"
    assert not _cached_graphs(tmp_path / "inductor-cache"), "nor was its code generated (and saved) in that pass"

    _, filled = run_pass(_request(tmp_path / "fill", early=False), "timing", "none")  # compiles into the cache
    assert filled["status"] == "ok"
    assert _cached_graphs(tmp_path / "inductor-cache")

    lock, after = tmp_path / ".gpu.lock", tmp_path / ".gpu.previous-done"
    proc = subprocess.Popen(
        [sys.executable, str(HARNESS), "--workload", str(WORKLOAD), "--run-dir", str(tmp_path / "warm"),
         "--result", str(tmp_path / "warm" / "harness.json"), "--provenance", str(tmp_path / "warm" / "prov.json"),
         "--profiler", "none", "--compile-mode", "inductor", "--warmup-iters", "1", "--warm-up-early",
         "--gpu-lock", str(lock), "--gpu-lock-after", str(after)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_warmed_up(lock, proc)
        assert proc.poll() is None, "the window waits for the previous pass's"
        previous_done = time.time()  # a file's mtime comes from a coarser clock than time.time()
        after.touch()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    warm = json.loads((tmp_path / "warm" / "harness.json").read_text())
    assert warm["status"] == "ok"
    marks = warm["phase_started_at"]  # rounded to the millisecond
    assert marks["waiting for the GPU lock (window)"] <= previous_done + 0.001, "it compiled and warmed up before"
    assert marks["measure"] >= previous_done - 0.01, "its window came after the previous pass's"


def _wait_until_warmed_up(lock, proc, timeout_s: float = 120.0) -> None:
    """Until the pass has held the lock shared (building, compiling, warming up) and let it go (waiting for the
    previous pass's window)."""
    held_once, deadline = False, time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with open(lock, "a+") as probe:
            try:
                fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held_once = True
            else:
                fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
                if held_once:
                    return
        time.sleep(0.01)
    raise AssertionError("the pass never held the GPU lock and let it go")


def _cached_graphs(cache_dir) -> list:
    """The compiled graphs in Inductor's FX graph cache under `cache_dir`."""
    return [p for p in (cache_dir / "fxgraph").rglob("*") if p.is_file()] if (cache_dir / "fxgraph").is_dir() else []
