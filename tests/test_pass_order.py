"""The order in which `run`'s passes take the GPU, checked with real harness processes on this machine: the
no-profiler timing pass measures first, while the main pass (here torch.profiler) waits for the GPU; in eager
mode the main pass warms up beside it and only its window waits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO

from mcp_server.backends.registry import REGISTRY
from mcp_server.capture.request import CaptureRequest, WorkloadOptions
from mcp_server.capture.schedule import capture
from mcp_server.rundir import RunDir

WORKLOAD = REPO / "tests" / "workloads" / "tiny_mlp.py"


def test_the_timing_pass_measures_first_and_the_main_pass_warms_up_beside_it(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    req = CaptureRequest(workload=WORKLOAD, run_dir=run_dir, python=sys.executable,
                         options=WorkloadOptions(warmup_iters=1))
    manifest = capture(req, REGISTRY["torch"], ["operator-profiler", "profile", str(WORKLOAD)], timing=True)

    assert [p.name for p in manifest.passes] == ["torch", "timing"]
    timing, main = (json.loads(run_dir.harness_result(name).read_text()) for name in ("timing", "torch"))
    assert timing["status"] == main["status"] == "ok"
    assert main["phase_started_at"]["measure"] > timing["phase_started_at"]["measure"], "the timing pass measures first"
    assert main["warmed_up_early"] is True, "eager: the main pass warms up without waiting for the timing window"
    assert timing["warmed_up_early"] is False, "the first pass has no window to wait for"
    assert not list(run_dir.path.glob(".gpu.*")), "the lock and its markers are gone once the passes end"
