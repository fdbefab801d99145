"""The timing pass's harness on this machine: K untraced windows, then the traced ones, and no kernel trace
without a GPU (the assembly then has nothing to join, and says so)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO

HARNESS = REPO / "mcp_server" / "children" / "harness.py"


def test_untraced_windows_then_traced_ones(tmp_path: Path) -> None:
    result = tmp_path / "harness.json"
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--workload", str(REPO / "tests" / "workloads" / "tiny_mlp.py"),
         "--run-dir", str(tmp_path), "--result", str(result), "--profiler", "kernels",
         "--kineto-trace", str(tmp_path / "kineto_trace.json"), "--windows", "4"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(result.read_text())
    assert data["status"] == "ok" and data["profiler"] == "kernels"
    assert len(data["windows"]) == 4 and len(data["traced_windows"]) == 2
    assert all(w["wall_time_ns"] > 0 for w in data["windows"] + data["traced_windows"])
    assert data["window"]["wall_time_ns"] == data["windows"][-1]["wall_time_ns"]  # the last untraced window
    assert "no CUDA device: the timing pass traced no kernels" in data["warnings"]
    assert not (tmp_path / "kineto_trace.json").exists() and "clocks" not in data
