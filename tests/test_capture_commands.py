"""The command lines the capture passes run: the ncu replay filters and the harness's no-profiler timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES

from mcp_server.capture.request import CaptureRequest, GpuTurn, harness_command
from mcp_server.process import child_script
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import NcuOptions
from plugins.ncu.command import capture_command, replayed_kernels

HARNESS = child_script("harness")


def _after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_default_replay_is_the_measure_range_deduplicated_on_the_mangled_name():
    cmd = capture_command("ncu", Path("/r/report"), NcuOptions())
    # The window is cudaProfilerStart..Stop, process-wide: an NVTX range filter would drop the launches of
    # every host thread but the one that opened the measure range (two threads on the H200: 50 of 51 lost).
    assert _after(cmd, "--profile-from-start") == "off" and "--nvtx-include" not in cmd
    assert "--nvtx" in cmd  # each kernel's NVTX stack still comes with it
    # ncu's per-launch-config key is (kernel name per --kernel-name-base, grid, block, shared memory). Plain
    # Triton names do not demangle, so keyed on demangled names distinct Triton kernels of one shape were
    # collapsed into one (mlp_activations inductor on the H200: 6 of 25 launches left without counters);
    # mangled names tell them, and template instances sharing a function name, apart.
    assert _after(cmd, "--kernel-name-base") == "mangled"
    assert (_after(cmd, "--filter-mode"), _after(cmd, "--launch-count")) == ("per-launch-config", "1")
    # Inductor's compile workers are never injected: only the workload's own process launches window kernels.
    assert _after(cmd, "--target-processes") == "application-only"
    assert _after(cmd, "--export") == "/r/report"


def test_targeted_replay_drops_the_deduplication():
    cmd = capture_command("ncu", Path("/r/report"), NcuOptions(kernel_regex="gemm", launch_skip=2, launch_count=5))
    assert (_after(cmd, "--kernel-name"), _after(cmd, "--launch-skip"), _after(cmd, "--launch-count")) == (
        "regex:" + replayed_kernels("gemm"), "2", "5",
    )
    assert "--filter-mode" not in cmd
    assert "--filter-mode" not in capture_command("ncu", Path("/r/report"), NcuOptions(dedupe=False))


def test_sudo_never_prompts():
    cmd = capture_command("/opt/ncu", Path("/r/report"), NcuOptions(ncu_sudo=True))
    assert cmd[:4] == ["sudo", "-n", "--preserve-env", "/opt/ncu"]


def test_queue_ahead_timing_is_asked_of_the_harness():
    run_dir = RunDir(Path("/r"))
    req = CaptureRequest(workload=EXAMPLES / "conv_block" / "conv_block.py", run_dir=run_dir,
                         turn=GpuTurn(queue_ahead=True))
    cmd = harness_command(req, "none", "timing")
    assert "--queue-ahead" in cmd
    assert (_after(cmd, "--run-dir"), _after(cmd, "--result")) == ("/r/timing", "/r/timing/harness.json")
    assert "--queue-ahead" not in harness_command(CaptureRequest(workload=req.workload, run_dir=run_dir), "none",
                                                  "timing")


def test_queue_ahead_needs_the_no_profiler_pass(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--workload", str(EXAMPLES / "conv_block" / "conv_block.py"),
         "--run-dir", str(tmp_path), "--result", str(tmp_path / "r.json"), "--profiler", "nvtx", "--queue-ahead"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "--queue-ahead times the window without a profiler: use it with --profiler none" in proc.stderr


def test_graph_replay_timing_is_asked_of_the_harness_and_needs_the_no_profiler_pass(tmp_path):
    run_dir = RunDir(tmp_path)
    req = CaptureRequest(workload=EXAMPLES / "conv_block" / "conv_block.py", run_dir=run_dir,
                         turn=GpuTurn(graph_replay=True))
    assert "--graph-replay" in harness_command(req, "none", "timing")
    assert "--graph-replay" not in harness_command(CaptureRequest(workload=req.workload, run_dir=run_dir), "none",
                                                   "timing")
    proc = subprocess.run(
        [sys.executable, str(HARNESS), "--workload", str(req.workload), "--run-dir", str(tmp_path),
         "--result", str(tmp_path / "r.json"), "--profiler", "torch", "--kineto-trace", str(tmp_path / "t.json"),
         "--graph-replay"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "--graph-replay times the window without a profiler: use it with --profiler none" in proc.stderr
