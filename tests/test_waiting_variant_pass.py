"""The shape-variant pass of `run` starts with the other passes, suspended under `ncu --mode launch`; once the
plan is known ncu attaches with the plan's filter, or the waiting workload is stopped. ncu's side of the
handshake is played by tests/scripts/ncu_standin.py here; the real tool runs on the GPU machine."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES

from mcp_server.capture.request import CaptureRequest, WorkloadOptions
from mcp_server.capture.variants import WaitingVariantPass
from mcp_server.errors import WorkloadError
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import VARIANT_PASS
from plugins.ncu.command import attach_command, capture_command, launch_command

STANDIN = Path(__file__).parent / "scripts" / "ncu_standin.py"
VARIANTS = NcuOptions(dedupe=False, kernel_regex="^(gemm)$", launch_skip=1, launch_count=2)


def _after(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_launch_waits_on_its_own_port_and_attach_brings_the_replay_options():
    launch = launch_command("/opt/ncu", 50123, NcuOptions())
    attach = attach_command("/opt/ncu", 50123, Path("/r/ncu_variants/report"), VARIANTS)
    assert _after(launch, "--mode") == "launch" and _after(attach, "--mode") == "attach"
    # Ports from a free one on: another run on the host is unlikely to share the range (ncu's default of 64
    # ports; limited to one, ncu 2025.3 found no process to attach to on the H100).
    for cmd in (launch, attach):
        assert _after(cmd, "--port") == "50123" and "--max-connections" not in cmd
    assert _after(attach, "--hostname") == "127.0.0.1"
    assert _after(launch, "--target-processes") == "application-only"
    assert "--metrics" not in launch and "--export" not in launch  # what to replay is only known at attach
    # NVTX recording is set up where the workload starts (ncu 2025.3 refuses --nvtx with --mode attach).
    assert "--nvtx" in launch and "--nvtx" not in attach
    replay = capture_command("/opt/ncu", Path("/r/ncu_variants/report"), VARIANTS)
    assert attach[attach.index("--port") + 2:] == replay[replay.index("--nvtx") + 1:]


@pytest.fixture
def request_(tmp_path, monkeypatch) -> CaptureRequest:
    ncu = tmp_path / "ncu"
    ncu.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    ncu.chmod(0o755)
    monkeypatch.setenv("NCU", str(ncu))
    monkeypatch.setenv("OPERATOR_PROFILER_EXAMPLE_SCALE", "small")
    return CaptureRequest(
        workload=EXAMPLES / "mlp_activations" / "mlp_activations.py", run_dir=RunDir(tmp_path / "run"),
        options=WorkloadOptions(warmup_iters=1), timeout_s=120,
    )


@pytest.fixture
def started():
    """Start WaitingVariantPass objects; whatever a test leaves running is stopped when it ends."""
    passes: list[WaitingVariantPass] = []

    def start(*args) -> WaitingVariantPass:
        passes.append(WaitingVariantPass(*args).start())
        return passes[-1]

    yield start
    for waiting in passes:
        waiting.discard()


def _launcher_pid(lines: list[str]) -> int:
    return int(next(m.group(1) for line in lines if (m := re.search(r"attach on ports \d+ \(pid=(\d+)\)", line))))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_attach_runs_the_waiting_workload_to_its_window(request_, started):
    lines: list[str] = []
    waiting = started(request_, NcuOptions(), lines.append, None)
    # The window's NVTX ranges need a CUDA build of torch: on this CPU the workload, attached to, builds, warms
    # up and then fails as it opens its window; the pass reports that failure as the workload's own.
    with pytest.raises(WorkloadError, match="during measure"):
        waiting.attach(VARIANTS, None)
    assert any("attaching ncu to the waiting workload" in line for line in lines)
    attach_log = request_.run_dir.attach_log(VARIANT_PASS).read_text()
    assert "Disconnected" in attach_log, "ncu stayed attached until the workload ended"
    assert request_.run_dir.ncu_report(VARIANT_PASS).is_file()
    assert _gone(_launcher_pid(lines))


def test_discard_stops_the_waiting_workload(request_, started):
    lines: list[str] = []
    waiting = started(request_, NcuOptions(), lines.append, None)
    assert waiting._waiting.wait(timeout=60)
    pid = _launcher_pid(lines)
    waiting.discard()
    assert _gone(pid), "the launcher (and the workload it holds) is stopped"
    assert not request_.run_dir.harness_result(VARIANT_PASS).exists(), "the workload never ran"


def test_a_failed_attach_stops_the_workload_so_a_fresh_pass_can_replay(request_, monkeypatch, started):
    monkeypatch.setenv("NCU_STANDIN_REFUSE", "1")
    lines: list[str] = []
    waiting = started(request_, NcuOptions(), lines.append, None)
    assert waiting.attach(VARIANTS, None) is None
    assert _gone(_launcher_pid(lines))
    assert any("ncu could not attach" in line and "replaying in a fresh process" in line for line in lines)


def test_with_a_precompile_running_the_workload_starts_once_it_has_ended(request_, started, tmp_path):
    lines: list[str] = []
    ended = tmp_path / "bytecode.done"
    waiting = started(request_, NcuOptions(), lines.append, None, (ended, tmp_path / "nsys.window.done"))
    assert not waiting._waiting.wait(timeout=1.0)
    assert not any("Waiting for profiler to attach" in line for line in lines), "not launched yet"
    ended.touch()
    assert waiting._waiting.wait(timeout=60)
    waiting.discard()
    assert _gone(_launcher_pid(lines))


def test_a_pass_stopped_before_the_precompile_ended_never_starts(request_, started, tmp_path):
    lines: list[str] = []
    waiting = started(request_, NcuOptions(), lines.append, None, (tmp_path / "never",))
    waiting.discard()
    assert not waiting._thread.is_alive() and lines == []
    assert not request_.run_dir.output_log(VARIANT_PASS).exists()


def test_the_main_window_ending_first_starts_it_too(request_, started, tmp_path):
    lines: list[str] = []
    window_done = tmp_path / "nsys.window.done"  # a precompile with few workers can outlast the passes' start-up
    waiting = started(request_, NcuOptions(), lines.append, None, (tmp_path / "bytecode.done", window_done))
    assert not waiting._waiting.wait(timeout=0.5)
    window_done.touch()
    assert waiting._waiting.wait(timeout=60)
