"""Stopping a capture child gracefully: at the time limit or on a line of its output, the child gets SIGINT
and time to write what it gathered (what ncu does: it writes the kernels replayed so far), then is reaped."""

from __future__ import annotations

import sys
import time

import pytest
from fixtures_util import NSYS_RUNS, run_dir

from mcp_server.process import EarlyStop, run_child
from plugins.ncu.command import is_replayed_kernel, replayed_passes
from plugins.ncu.reader import read_ncu_report

# A child that prints one ncu-like line per 0.2 s and, on SIGINT, writes how many it printed, then exits (SIGINT is
# held while it prints and counts a line, so the count is exact).
CHILD = """
import signal, sys, time
from pathlib import Path
done = 0
def stop(*_):
    Path(sys.argv[1]).write_text(str(done)); sys.exit(9)
signal.signal(signal.SIGINT, stop if sys.argv[2] == "writes" else signal.SIG_IGN)
print("==PROF== Connected to process 1", flush=True)
while True:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # a line printed is a line counted
    print(f'==PROF== Profiling "kernel_{done}" - {done}: 0%....50%....100% - 17 passes', flush=True)
    done += 1
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    time.sleep(0.2)
"""


def _child(tmp_path, behaviour: str = "writes") -> list[str]:
    return [sys.executable, "-c", CHILD, str(tmp_path / "gathered.txt"), behaviour]


def test_a_condition_on_the_output_interrupts_the_child_which_keeps_what_it_gathered(tmp_path):
    seen = []

    def three_kernels(line: str) -> bool:
        seen.append(is_replayed_kernel(line))
        return sum(seen) >= 3

    early = EarlyStop(when=three_kernels)
    t0 = time.monotonic()
    code, timed_out = run_child(_child(tmp_path), tmp_path / "out.log", 60, early=early)
    assert (early.reason, timed_out, code) == ("condition", False, 9)
    assert (tmp_path / "gathered.txt").read_text() == "3"
    assert time.monotonic() - t0 < 10


def test_the_time_limit_interrupts_the_child_instead_of_killing_it(tmp_path):
    early = EarlyStop()
    code, timed_out = run_child(_child(tmp_path), tmp_path / "out.log", 1.0, early=early)
    assert (early.reason, timed_out, code) == ("timeout", True, 9)
    gathered = int((tmp_path / "gathered.txt").read_text())
    assert gathered >= 2
    log = (tmp_path / "out.log").read_text()
    assert log.count("==PROF== Profiling") == gathered


def test_a_child_ignoring_the_interrupt_is_killed_after_the_grace_period(tmp_path):
    early = EarlyStop(grace_s=1.0)
    t0 = time.monotonic()
    _, timed_out = run_child(_child(tmp_path, "ignores"), tmp_path / "out.log", 0.5, early=early)
    assert timed_out and early.reason == "timeout"
    assert not (tmp_path / "gathered.txt").exists()
    assert time.monotonic() - t0 < 8


def test_without_early_stop_the_time_limit_kills_the_child(tmp_path):
    _, timed_out = run_child(_child(tmp_path), tmp_path / "out.log", 0.5)
    assert timed_out
    assert not (tmp_path / "gathered.txt").exists()


@pytest.mark.parametrize("run", NSYS_RUNS)
def test_each_recorded_replay_line_is_one_kernel_of_the_report(run, tmp_path_factory):
    directory = run_dir(run, tmp_path_factory)
    lines = (directory / "ncu" / "output.log").read_text().splitlines()
    replayed = [line for line in lines if is_replayed_kernel(line)]
    assert len(replayed) == len(read_ncu_report(directory / "ncu" / "report.ncu-rep").records)
    assert not is_replayed_kernel("==PROF== Connected to process 1132 (/usr/bin/python3.12)")
    assert not is_replayed_kernel('==PROF== Profiling "vectorized_elementwise_kernel" - 7: 0%')
    # With a metric set of one pass ncu writes "pass" (seen on the H100 with benchmarks/ncu_pass_cost.py).
    assert replayed_passes('==PROF== Profiling "Kernel2" - 29: 0%....50%....100% - 1 pass') == 1
    assert replayed_passes(replayed[0]) == 17
