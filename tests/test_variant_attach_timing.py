"""When `run` attaches ncu to the waiting shape-variant pass: a few seconds before the main ncu pass's replay is
estimated to end, from the pace of the kernels it replayed so far, or once its window ended."""

from __future__ import annotations

import threading
import time

import pytest

from mcp_server.capture.passes import PassProgress, ReplayCount
from mcp_server.capture.variants import until_replay_nearly_done

REPLAYED = "==PROF== Profiling \"void at::native::kernel\" - {} - 17 passes"


def test_the_estimate_uses_the_plan_until_two_kernels_were_replayed_then_the_measured_pace():
    replays = ReplayCount()
    assert replays.seconds_left(0.0) is None, "no plan yet"
    replays.expected, replays.seconds_each = 10, 0.4
    assert replays.seconds_left(0.0) == pytest.approx(4.0)
    replays.replayed(100.0)
    assert replays.seconds_left(100.0) == pytest.approx(9 * 0.4)
    replays.replayed(101.0)
    replays.replayed(102.0)  # one kernel a second: 7 left
    assert replays.seconds_left(102.0) == pytest.approx(7.0)
    assert replays.seconds_left(102.5) == pytest.approx(6.5), "time since the latest kernel counts"
    assert replays.seconds_left(200.0) == 0.0
    for at in range(7):
        replays.replayed(103.0 + at)
    assert replays.done == 10 and replays.seconds_left(109.0) == 0.0
    replays.restart()
    assert replays.done == 0 and replays.seconds_left(0.0) == pytest.approx(4.0), "a new attempt starts over"


def test_the_ncu_pass_times_its_own_warm_up_from_the_harness_phases():
    from mcp_server.children.contract import PHASE_MARKER

    replays = ReplayCount()
    assert replays.warmup_estimate(1) == 0.0, "not measured yet"
    sink = PassProgress("ncu", [].append, replays)
    replays.warmup_iters = 4
    sink(f"{PHASE_MARKER}warmup")
    time.sleep(0.2)
    sink(f"{PHASE_MARKER}waiting for the GPU lock (window)")
    sink(f"{PHASE_MARKER}measure")
    assert replays.warmup_s is not None and 0.2 <= replays.warmup_s < 1.0, "from its own phase to the next only"
    assert replays.warmup_estimate(1) == pytest.approx(replays.warmup_s / 4), "one warm-up iteration of four"
    replays.restart()
    assert replays.warmup_s is None, "a new attempt warms up again"


def test_the_count_line_gives_the_measured_time_left():
    lines: list[str] = []
    replays = ReplayCount()
    replays.expected, replays.seconds_each = 40, 5.0  # a plan estimate far off the pace below
    sink = PassProgress("ncu", lines.append, replays)
    for i in range(3):
        sink(REPLAYED.format(i))
    counts = [line for line in lines if line.startswith("ncu pass: replayed")]
    assert counts[0] == "ncu pass: replayed 1 of 40 kernel configurations (estimate: 195 s left)"
    assert replays.done == 3
    left = replays.seconds_left(time.monotonic())
    assert left is not None and left < 5.0, "the replay's own pace, not the plan's 5 s per kernel"


def _waiter(replays: ReplayCount, ended, cancel: threading.Event | None, lead_s: float):
    lines: list[str] = []
    thread = threading.Thread(target=until_replay_nearly_done, args=(replays, ended, cancel, lines.append, lead_s))
    thread.start()
    return thread, lines


def test_it_waits_while_the_replay_is_far_from_its_end_and_attaches_once_it_is_near(tmp_path):
    replays = ReplayCount()
    replays.expected, replays.seconds_each = 100, 0.5
    thread, lines = _waiter(replays, tmp_path / "ncu.done", None, 2.0)
    time.sleep(0.4)
    assert thread.is_alive(), "50 s of replay left: not yet"
    assert lines == ["ncu_variants pass: attaching ncu once the ncu pass's replay is about 2 s from its end"]
    start = time.monotonic()
    for i in range(97):  # 3 kernels left at this pace: well within the lead
        replays.replayed(start + i * 0.01)
    thread.join(timeout=2.0)
    assert not thread.is_alive()


def test_it_attaches_at_once_when_the_main_window_ended_or_the_capture_is_cancelled(tmp_path):
    replays = ReplayCount()
    replays.expected, replays.seconds_each = 100, 0.5
    ended = tmp_path / "ncu.done"
    thread, _ = _waiter(replays, ended, None, 2.0)
    time.sleep(0.2)
    ended.touch()  # the main pass's window ended with fewer replays than the plan expected
    thread.join(timeout=2.0)
    assert not thread.is_alive()

    cancel = threading.Event()
    thread, _ = _waiter(ReplayCount(), tmp_path / "never", cancel, 2.0)  # no plan, no replay: only a stop ends it
    time.sleep(0.2)
    assert thread.is_alive()
    cancel.set()
    thread.join(timeout=2.0)
    assert not thread.is_alive()
