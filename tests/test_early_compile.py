"""A pass that compiles early (alongside the previous pass) may only reuse Inductor's cache: a graph the cache
lacks stops it before that graph runs; with every graph cached it compiles and warms up at once, and only its
window waits for the previous pass's."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from conftest import EXAMPLES, REPO

from mcp_server.capture.passes import NotCached, run_pass
from mcp_server.capture.request import CaptureRequest, GpuTurn, WorkloadOptions
from mcp_server.capture.schedule import _compiled_in_turn
from mcp_server.children.inductor_cache import WAITING_FOR_TUNING
from mcp_server.process import child_script
from mcp_server.rundir import RunDir

HARNESS = child_script("harness")

# On a GPU a workload whose Triton kernels autotune; on a CPU the smallest one Inductor compiles (C++ builds are slow)
WORKLOAD = (EXAMPLES / "mlp_activations" / "mlp_activations.py" if torch.cuda.is_available()
            else REPO / "tests" / "workloads" / "tiny_train.py")
TINY = REPO / "tests" / "workloads" / "tiny_mlp.py"


def _request(run_dir, early: bool) -> CaptureRequest:
    return CaptureRequest(workload=WORKLOAD, run_dir=RunDir(run_dir),
                          options=WorkloadOptions(compile_mode="inductor", warmup_iters=1),
                          turn=GpuTurn(warm_up_early=early))


def test_early_compile_stops_on_a_cold_cache_and_runs_from_a_warm_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    with pytest.raises(NotCached, match="did not hold a graph"):
        run_pass(_request(tmp_path / "cold", early=True), "timing", "none")
    cold = json.loads((tmp_path / "cold" / "timing" / "harness.json").read_text())
    assert cold["error"]["kind"] == "not_cached"
    assert "measure" not in cold["phase_started_at"], "nothing of the uncached graph ran"
    assert not _cached_graphs(tmp_path / "inductor-cache"), "nor was its code generated (and saved) in that pass"

    _, filled = run_pass(_request(tmp_path / "fill", early=False), "timing", "none")  # compiles into the cache
    assert filled is not None and filled.ok
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's Triton kernels autotune on a CUDA GPU")
def test_a_cached_graph_whose_kernels_are_not_tuned_yet_waits_for_their_configurations(tmp_path, monkeypatch):
    """The pass compiling a graph saves it before its first call tunes the kernels: an early pass that loads it in
    between waits for the configurations that pass saves, rather than tune them itself beside it (and maybe run
    others); with none saved in time it stops."""
    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    _, filled = run_pass(_request(tmp_path / "fill", early=False), "timing", "none")
    assert filled is not None and filled.ok
    tuned = {path: path.read_bytes() for path in cache.rglob("*.best_config")}
    assert tuned, "the workload's Triton kernels autotuned (several configurations each)"
    for path in tuned:
        path.unlink()

    waiting = threading.Event()
    results: list = []

    def progress(line: str) -> None:
        if WAITING_FOR_TUNING in line:
            waiting.set()

    worker = threading.Thread(target=lambda: results.append(
        run_pass(_request(tmp_path / "waits", early=True), "timing", "none", progress=progress)[1]))
    worker.start()
    try:
        assert waiting.wait(timeout=120), "the early pass waits for a tuned configuration"
        for path, content in tuned.items():  # as the pass compiling the graph saves them
            path.write_bytes(content)
    finally:
        worker.join(timeout=180)
    (waited,) = results
    assert waited["status"] == "ok" and waited["waited_for_tuned_configurations"]
    assert {path: path.read_bytes() for path in cache.rglob("*.best_config")} == tuned, "it tuned nothing itself"

    for path in tuned:
        path.unlink()
    with pytest.raises(NotCached, match="no tuned configuration"):
        run_pass(_request(tmp_path / "untuned", early=True), "timing", "none")
    refused = json.loads((tmp_path / "untuned" / "timing" / "harness.json").read_text())
    assert "measure" not in refused["phase_started_at"]
    assert not list(cache.rglob("*.best_config")), "it tuned nothing"


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


def test_a_pass_refused_on_a_cold_cache_compiles_from_it_once_the_first_pass_filled_it(tmp_path, monkeypatch):
    """`run`'s ncu pass on a cold cache: its early attempt stops at the miss; the next compiles from the cache,
    still beside the main pass, as soon as the first compiling pass's window is done, not after the main pass's
    window; its own window still waits for that one."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    filled, after = tmp_path / ".gpu.timing-done", tmp_path / ".gpu.main-done"
    second = CaptureRequest(workload=TINY, run_dir=RunDir(tmp_path / "second"),
                            options=WorkloadOptions(compile_mode="inductor", warmup_iters=1),
                            turn=GpuTurn(warm_up_early=True, lock=tmp_path / ".gpu.lock", after=after))
    refused, warmed = threading.Event(), threading.Event()

    def progress(line: str) -> None:
        if "compiling from it once the first compiling pass has filled it" in line:
            refused.set()
        if line == "ncu pass: waiting for the GPU lock (window)":
            warmed.set()

    records: list = []
    worker = threading.Thread(target=lambda: records.append(_compiled_in_turn(
        lambda r: run_pass(r, "ncu", "none", progress=progress)[0], second, "ncu", progress, filled=filled)))
    worker.start()
    try:
        assert refused.wait(timeout=180), "the early attempt stops at the cold cache's first miss"
        _, first = run_pass(CaptureRequest(workload=TINY, run_dir=RunDir(tmp_path / "first"),
                                           options=WorkloadOptions(compile_mode="inductor", warmup_iters=1)),
                            "timing", "none")
        assert first is not None and first.ok
        filled_at = time.time()
        filled.touch()
        assert warmed.wait(timeout=180), "it compiles from the filled cache and warms up"
        assert worker.is_alive(), "its window waits for the main pass's"
        after_at = time.time()
        after.touch()
    finally:
        after.touch()
        filled.touch()
        worker.join(timeout=180)
    (record,) = records
    assert any("once the first compiling pass's window was done" in note for note in record.notes)
    assert not any("after the previous pass's window" in note for note in record.notes)
    result = json.loads(second.run_dir.harness_result("ncu").read_text())
    assert result["status"] == "ok" and result["warmed_up_early"] is True
    marks = result["phase_started_at"]  # rounded to the millisecond
    assert marks["warmup"] >= filled_at - 0.01, "it waited for the cache to be filled"
    assert marks["waiting for the GPU lock (window)"] <= after_at + 0.001, "and warmed up before the main window"
    assert marks["measure"] >= after_at - 0.01
