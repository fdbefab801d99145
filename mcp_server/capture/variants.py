"""The shape-variant pass: launches that ncu's per-launch-config key cannot tell apart, replayed by a third pass.

Once nsys's timeline is exported, its replay plan is announced; when launches of one configuration differ in
input shapes, a pass replays the first launch of each such variant. Under `run` that pass starts with the others,
suspended under `ncu --mode launch`, and ncu attaches to it with the plan's filter (`WaitingVariantPass`) shortly
before the main ncu pass's replay is estimated to end (`until_replay_nearly_done`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from mcp_server.capture.budget import budget_note, refitted, variant_share, within_budget
from mcp_server.capture.passes import (
    PERMISSION_ERROR,
    Cancel,
    ReplayCount,
    kept_failure,
    kept_report,
    ncu_pass,
    raise_if_permission,
    require_ncu,
    run_pass,
)
from mcp_server.capture.replay_plan import ReplayPlan, plan_replays
from mcp_server.capture.request import CaptureRequest
from mcp_server.errors import CaptureFailed, WorkloadError
from mcp_server.process import EarlyStop, run_child
from mcp_server.progress import Progress
from mcp_server.schema.harness import HarnessResult
from mcp_server.schema.io import write_text_atomic
from mcp_server.schema.manifest import PassRecord
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import VARIANT_PASS
from plugins.executables import gpu_name
from plugins.ncu.command import attach_command, launch_command

ATTACHED_EXIT_S = 60.0  # how long an attached workload may take to exit once ncu's session has ended
WAITING_LINE = "==PROF== Waiting for profiler to attach"  # what ncu --mode launch prints once it listens
POLL_S = 0.1
# ncu attaches this long before the main pass's replay is estimated to end: attaching and creating the workload's
# CUDA context under ncu take about 3 s on the H100, and an attached ncu client keeps a CPU core busy until the
# pass can run, which slows the main replay if it attaches earlier.
ATTACH_LEAD_S = 6.0
# A shape-variant pass runs when its variants hold at least this share of the window's kernel time: its start, the
# workload's warm-up and ncu's report cost seconds whatever it replays (8 s on the H200 for a training script's one
# affordable variant, after the main pass had taken most of the budget).
MIN_VARIANT_SHARE = 0.01
# Kernels the ncu pass may replay while the plan is made (about 1 s of planning at 0.3 s each): a plan that splits the
# configurations stops that pass no sooner than this many after those it had replayed.
PLANNING_REPLAYS = 4


def ncu_variants_pass(
    req: CaptureRequest,
    options: NcuOptions,
    progress: Progress,
    cancel: Cancel = None,
    waiting: WaitingVariantPass | None = None,
    replays: ReplayCount | None = None,
    plan: ReplayPlan | None = None,
) -> PassRecord | None:
    """Replay the shape variants of the nsys timeline's replay plan when there are any and `options` is the
    default deduplicated replay of the whole window. A `waiting` pass (started early, suspended) is attached to,
    or stopped when there is nothing to replay. Without a `plan`, it is made and announced here, and the ncu
    pass's `replays` learn how many kernels it replays. Once the ncu pass's pace is measured (`replays`), the plan
    is fitted to the budget again at that pace: a pass whose configurations took the whole budget leaves no room
    for variants, and this pass does not run."""
    if plan is None:
        plan = planned(req, options, progress, replays)
    calls = req.run_dir.replay_calls(VARIANT_PASS)
    calls.unlink(missing_ok=True)
    if not (plan.variants and options.whole_window):
        if waiting is not None:
            waiting.discard()
        return None
    if waiting is not None and replays is not None and req.turn.after is not None:
        # this pass takes the GPU once the ncu pass's window has ended: that window's marker bounds the wait
        until_replay_nearly_done(replays, req.turn.after, cancel, progress)
    if replays is not None:
        plan = _at_measured_pace(plan, replays, _warmup_s(req, replays), progress)
    if not plan.variants or not _worth_a_pass(plan, progress):
        if waiting is not None:
            waiting.discard()
        return None
    variant_options = variants_options(options, plan)
    if plan.calls is not None:  # read by the pass's harness when its window begins
        write_text_atomic(calls, json.dumps(plan.calls))
    try:
        record = waiting.attach(variant_options, cancel) if waiting is not None else None
        if record is None:
            record = ncu_pass(req.with_turn(replay_calls=calls), variant_options, progress, cancel, name=VARIANT_PASS)
    except (CaptureFailed, WorkloadError) as exc:
        if PERMISSION_ERROR in exc.message:
            raise
        return _failed(exc, progress)
    if plan.calls is not None:
        record.replayed_launches = plan.replayed
    if (note := budget_note(plan)) is not None:
        record.notes.append(note)
    return record


def _failed(exc: CaptureFailed | WorkloadError, progress: Progress) -> PassRecord | None:
    """A shape-variant pass that failed, as the run keeps it: the main ncu pass's counters stand (each variant takes
    its configuration's, as a variant left out of the budget does) and the pass's record says why. (ncu profiles
    nothing, and writes no report, when the process chose other kernels than the nsys pass's: cuDNN's autotuner
    may pick other algorithms in every process.)"""
    records = kept_failure(exc, VARIANT_PASS, "shape-variant pass", "its launches take their configuration's counters",
                           progress)
    return records[0] if records else None


def _worth_a_pass(plan: ReplayPlan, progress: Progress) -> bool:
    """Whether the variants the plan replays hold enough of the window's kernel time (`MIN_VARIANT_SHARE`) to pay for
    a pass of their own; said when they do not (each then takes the nearest measured shape's counters)."""
    share = variant_share(plan)
    if share >= MIN_VARIANT_SHARE:
        return True
    progress(f"{VARIANT_PASS} pass: not run: the {len(plan.variants)} shape variants the replay budget affords hold "
             f"{100 * share:.2f} % of the window's kernel time, less than the pass's own start and warm-up cost; each "
             "takes the counters of the nearest measured shape of its configuration")
    return False


def _warmup_s(req: CaptureRequest, replays: ReplayCount | None) -> float:
    """The shape-variant pass's warm-up under ncu (`req`'s warm-up iterations), estimated from the ncu pass's own;
    0 before that was measured."""
    return replays.warmup_estimate(req.options.warmup_iters) if replays is not None else 0.0


def _at_measured_pace(plan: ReplayPlan, replays: ReplayCount, start_s: float, progress: Progress) -> ReplayPlan:
    """The plan fitted again at the pace the ncu pass replays at, measured by now, and with the variant pass's
    warm-up `start_s` (`budget.refitted`), said when it changes what the variant pass replays."""
    pace = replays.pace()
    fitted = refitted(plan, pace, start_s)
    if fitted is plan:
        return plan
    if fitted.seconds_each != plan.seconds_each:
        progress(f"ncu: the ncu pass replays {fitted.seconds_each:.2f} s per kernel, not the {plan.seconds_each:.2f} s "
                 "estimated: the replay budget is fitted again")
    else:
        progress(f"ncu: the shape-variant pass's warm-up under ncu is estimated at {start_s:.1f} s from the ncu "
                 "pass's: the replay budget is fitted again")
    if (note := budget_note(fitted)) is not None:
        progress(f"ncu: {note}")
    if not fitted.variants:
        progress(f"{VARIANT_PASS} pass: not run: the configurations take the whole replay budget; each shape variant "
                 "takes the counters of the nearest measured shape of its configuration")
    return fitted


def until_replay_nearly_done(replays: ReplayCount, ended: Path, cancel: Cancel, progress: Progress,
                             lead_s: float = ATTACH_LEAD_S) -> None:
    """Wait until the main ncu pass's replay is estimated to end within `lead_s`, or its window ended (`ended`
    exists), or the capture is cancelled."""
    said = False
    while not ended.exists() and not (cancel is not None and cancel.is_set()):
        left = replays.seconds_left(time.monotonic())
        if left is not None and left <= lead_s:
            return
        if not said:
            progress(f"{VARIANT_PASS} pass: attaching ncu once the ncu pass's replay is about {lead_s:.0f} s from "
                     "its end")
            said = True
        time.sleep(POLL_S)


class _Either(threading.Event):
    """Set when this event or `other` is."""

    def __init__(self, other: Cancel) -> None:
        super().__init__()
        self._other = other

    def is_set(self) -> bool:
        return super().is_set() or (self._other is not None and self._other.is_set())


class WaitingVariantPass:
    """The shape-variant pass of `run`, started with the other passes under `ncu --mode launch`.

    Its workload imports torch and the compiler at once, then waits at its first CUDA call. Once nsys's timeline
    is exported and its plan names shape variants, `attach` connects ncu with the plan's filter: the pass then
    builds, warms up after the ncu pass's window and replays them. `discard` stops it when there is nothing to
    replay. Started this early, its seconds of Python start-up are no longer spent after the ncu pass's replay.
    With `after` (the bytecode precompile's end, and the main pass's window's as a bound: a precompile with few
    workers may take longer than the passes' start-up) it starts once one of those files exists: its imports then
    load compiled bytecode and leave the CPUs to the passes whose windows come first.
    """

    def __init__(self, req: CaptureRequest, options: NcuOptions, progress: Progress, cancel: Cancel,
                 after: tuple[Path, ...] = ()) -> None:
        self.req, self.options, self.progress, self.after = req, options, progress, after
        self.ncu = require_ncu()
        self.port = _free_port()
        self._stop = _Either(cancel)
        self._waiting = threading.Event()  # ncu's launcher said it waits for a connection
        self._record: PassRecord | None = None
        self._harness: HarnessResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"pass-{VARIANT_PASS}", daemon=True)

    def start(self) -> WaitingVariantPass:
        """Start the workload (once a file of `after` exists, when given); it runs until its first CUDA call, then
        waits for `attach`."""
        self._thread.start()
        return self

    def _run(self) -> None:
        while self.after and not any(path.exists() for path in self.after):  # the bytecode precompile still runs
            if self._stop.is_set():
                return
            time.sleep(POLL_S)
        waiting = replace(self.req, timeout_s=2 * self.req.timeout_s)  # its limit also covers the wait for nsys
        waiting = waiting.with_turn(replay_calls=self.req.run_dir.replay_calls(VARIANT_PASS), pageable_batches=True)
        prefix = launch_command(self.ncu, self.port, self.options)

        def watch(line: str) -> None:
            if line.startswith(WAITING_LINE):
                self._waiting.set()
            self.progress(line)

        try:
            self._record, self._harness = run_pass(waiting, VARIANT_PASS, "nvtx", prefix, watch, self._stop,
                                                   replaying=True)
        except BaseException as exc:  # noqa: BLE001 - reported by attach(), or dropped by discard()
            self._error = exc

    def attach(self, options: NcuOptions, cancel: Cancel) -> PassRecord | None:
        """Attach ncu with `options` and let the pass run to its end; None when ncu could not attach (the
        workload is then stopped, and the caller replays in a fresh process)."""
        run_dir = self.req.run_dir
        cmd = attach_command(self.ncu, self.port, run_dir.ncu_report_base(VARIANT_PASS), options,
                             self.req.compile_mode == "cudagraphs", gpu_name())
        deadline = time.monotonic() + self.req.timeout_s
        while not self._waiting.wait(timeout=POLL_S) and self._thread.is_alive() and time.monotonic() < deadline:
            if cancel is not None and cancel.is_set():
                break
        early = EarlyStop()
        log = run_dir.attach_log(VARIANT_PASS)
        if self._waiting.is_set():
            self.progress(f"{VARIANT_PASS} pass: attaching ncu to the waiting workload to replay the shape variants")
            code, _ = run_child(cmd, log, self.req.timeout_s, self.progress, cancel, early)
            if code == 0 or run_dir.ncu_report(VARIANT_PASS).is_file():
                self._thread.join(timeout=ATTACHED_EXIT_S)  # an attached workload ends with ncu's session
        if not self._waiting.is_set() or self._thread.is_alive() or self._record is None and self._error is None:
            self.discard()
            self.progress(f"{VARIANT_PASS} pass: ncu could not attach (see {log}); replaying in a fresh process")
            return None
        if self._error is not None:
            raise_if_permission(self.req, VARIANT_PASS)
            raise self._error
        assert self._record is not None
        self._record.attach_command = cmd
        self._record.ncu = options
        if early.reason is not None:  # no condition was given: only the time limit stops it
            self._record.stopped_early = "timeout"
        return kept_report(self._record, self.req, self.progress, self._harness)

    def discard(self) -> None:
        """Stop the waiting workload (and its ncu); nothing it did is kept."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _free_port() -> int:
    """A TCP port free on this host now, for one launched workload and the ncu that attaches to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def planned(req: CaptureRequest, options: NcuOptions, progress: Progress, replays: ReplayCount | None) -> ReplayPlan:
    """The replay plan of the run's nsys timeline fitted to the replay budget (the default deduplicated replay of the
    whole window only), announced; the ncu pass's count learns what it expects, and where it must stop."""
    plan = plan_replays(req.run_dir.nsys_sqlite())
    if options.whole_window:  # the pace the ncu pass replays at, once measured, else the measured cost per kernel
        pace = replays.pace() if replays is not None else None
        done = replays.done + PLANNING_REPLAYS if replays is not None else 0  # what it replays while this plans
        plan = within_budget(plan, options.replay_budget_s, pace or plan.estimate_s(1), _warmup_s(req, replays), done)
        if pace is not None:
            progress(f"ncu: replay budget planned at the ncu pass's own pace, {pace:.2f} s per kernel")
    announce_plan(plan, progress)
    if replays is not None and options.whole_window:
        replays.expected = plan.configurations  # the pass stops on its replay time, not on the plan's estimate
        replays.seconds_each = plan.estimate_s(1)
        if plan.config_pass:  # it stops at a count: the second pass replays the configurations holding most time
            replays.limit = replays.expected = plan.main_limit
    return plan


def variants_options(options: NcuOptions, plan: ReplayPlan) -> NcuOptions:
    """The ncu options replaying the plan's shape variants: every launch of their kernels while the harness
    profiles the plan's module calls, or else the run of their launches from the first variant to the last."""
    if plan.config_pass:  # each configuration of the plan's kernels once
        return options.model_copy(update={"dedupe": True, "kernel_regex": plan.kernel_regex})
    if plan.calls is not None:
        return options.model_copy(update={"dedupe": False, "kernel_regex": plan.kernel_regex})
    return options.model_copy(update={"dedupe": False, "kernel_regex": plan.kernel_regex,
                                      "launch_skip": plan.launch_skip, "launch_count": plan.launch_count})


def announce_plan(plan: ReplayPlan, progress: Progress) -> None:
    """Say what the ncu passes replay, with estimated times (estimates: the measured time per replay pass)."""
    progress(f"ncu: {plan.launches} window launches, {plan.configurations} distinct configurations replayed by the "
             f"ncu pass (estimate: {plan.estimate_s(plan.configurations):.0f} s of replay)")
    if (note := budget_note(plan)) is not None:
        progress(f"ncu: {note}")
    if plan.variants and not plan.config_pass:  # a split's second pass is in the budget note above
        count = len(plan.replayed) if plan.calls is not None else plan.launch_count
        where = f"inside {len(plan.calls)} module calls" if plan.calls is not None else "in a run of launches"
        progress(f"ncu: {len(plan.variants)} launches share a configuration but not the input shapes of an earlier "
                 f"one: a second ncu pass replays them ({count} launches {where}; estimate: "
                 f"{plan.estimate_s(count):.0f} s of replay after it warms up)")
    if plan.same_work:
        progress(f"ncu: {plan.same_work} element-wise or layout-conversion launches differ in their operator's shapes "
                 "only: their configuration (and element counts) fix their work, so the same counters; not replayed")
