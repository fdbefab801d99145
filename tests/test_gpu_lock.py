"""The GPU lock protocol between the two passes of `run`: the second waits until the first took the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from conftest import EXAMPLES

from mcp_server.pipeline.capture import HARNESS


def _harness(run_dir, *lock_args):
    return subprocess.Popen(
        [sys.executable, str(HARNESS), "--workload", str(EXAMPLES / "mlp_activations" / "mlp_activations.py"),
         "--run-dir", str(run_dir), "--profiler", "none", "--warmup-iters", "1", *lock_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def test_second_pass_waits_for_the_first(tmp_path):
    lock, taken = tmp_path / ".gpu.lock", tmp_path / ".gpu.taken"
    second = _harness(tmp_path / "second", "--gpu-lock", str(lock), "--gpu-lock-after", str(taken))
    try:
        time.sleep(6)
        assert second.poll() is None, "the second pass must wait while the first has not taken the GPU"
        result = json.loads((tmp_path / "second" / "harness.json").read_text()) if (
            tmp_path / "second" / "harness.json").exists() else {}
        assert result.get("status") != "ok"
        first = _harness(tmp_path / "first", "--gpu-lock", str(lock))
        assert first.wait(timeout=120) == 0
        assert taken.exists(), "the first pass marks the GPU taken"
        assert second.wait(timeout=120) == 0
    finally:
        for proc in (second,):
            if proc.poll() is None:
                proc.kill()
    first_result = json.loads((tmp_path / "first" / "harness.json").read_text())
    second_result = json.loads((tmp_path / "second" / "harness.json").read_text())
    assert first_result["status"] == second_result["status"] == "ok"
    assert first_result["finished_at"] <= second_result["finished_at"]
