"""Capture: run the harness as a child process, optionally under a profiler, into the run directory.

The engine never imports the workload or torch: the harness runs under the workload's own interpreter.
Every child runs in its own process group and is killed with it on timeout, error or interrupt.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from mcp_server.errors import CancelledCapture, CaptureFailed, UsageError, WorkloadError
from mcp_server.pipeline.bytecode import interpreter_env, uses_cache
from mcp_server.pipeline.harness import COMPILE_MODES, CONTRACT
from mcp_server.schema.manifest import PassRecord

HARNESS = Path(__file__).with_name("harness.py")
SCRIPT_WINDOW = re.compile(r"\bNvtxCapture\s*\(")
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """Default progress sink."""


@dataclass
class CaptureRequest:
    """What to run and how: the workload contract options shared by every pass."""

    workload: Path
    run_dir: Path
    python: str = sys.executable
    compile_mode: str = "eager"
    warmup_iters: int = 3
    iters: int = 1
    seed: int = 0
    train_step: bool = False
    timeout_s: float = 600.0
    gpu_lock: Path | None = None
    gpu_lock_after: Path | None = None
    gpu_lock_done: Path | None = None
    queue_ahead: bool = False
    graph_replay: bool = False
    import_compiler_early: bool = False
    compile_early_if_cached: bool = False
    script_args: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Reject bad input before anything runs, each with a remedy."""
        if not self.workload.is_file():
            raise WorkloadError(f"workload not found: {self.workload}", "pass the path of an existing .py file")
        if self.workload.suffix != ".py":
            raise WorkloadError(f"workload is not a .py file: {self.workload}", "pass a Python file")
        source = self.workload.read_text(encoding="utf-8", errors="replace")
        if not (CONTRACT.search(source) or SCRIPT_WINDOW.search(source)):
            raise WorkloadError(
                f"{self.workload} defines no get_model_and_input() and uses no NvtxCapture window",
                "add `def get_model_and_input(): return model, inputs` (see README: workload contract)",
            )
        if self.compile_mode not in COMPILE_MODES:
            raise UsageError(f"unknown compile mode {self.compile_mode!r}", f"choose one of {', '.join(COMPILE_MODES)}")
        if self.warmup_iters < 0 or self.iters < 1:
            raise UsageError("--warmup-iters must be >= 0 and --iters >= 1", "pass non-negative counts")
        if not (Path(self.python).is_file() or Path(self.python).name == self.python):
            raise UsageError(f"python interpreter not found: {self.python}", "pass --python PATH to an interpreter")


class NotCached(Exception):
    """A pass asked to compile early from Inductor's cache met a graph the cache did not hold; it ran none of it
    and can be run again to compile after the previous pass's window."""


def now_iso() -> str:
    """UTC timestamp with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def harness_command(req: CaptureRequest, profiler: str, pass_dir: Path) -> list[str]:
    """The harness invocation under the workload's interpreter."""
    cmd = [
        req.python, str(HARNESS),
        "--workload", str(req.workload.resolve()), "--run-dir", str(pass_dir.resolve()),
        "--profiler", profiler, "--compile-mode", req.compile_mode,
        "--warmup-iters", str(req.warmup_iters), "--iters", str(req.iters), "--seed", str(req.seed),
    ]
    if req.train_step:
        cmd.append("--train-step")
    if req.gpu_lock is not None:
        cmd += ["--gpu-lock", str(req.gpu_lock)]
    if req.gpu_lock_after is not None:
        cmd += ["--gpu-lock-after", str(req.gpu_lock_after)]
    if req.gpu_lock_done is not None:
        cmd += ["--gpu-lock-done", str(req.gpu_lock_done)]
    if req.queue_ahead:
        cmd.append("--queue-ahead")
    if req.graph_replay:
        cmd.append("--graph-replay")
    if req.import_compiler_early:
        cmd.append("--import-compiler-early")
    if req.compile_early_if_cached:
        cmd.append("--compile-early-if-cached")
    for arg in req.script_args:
        cmd += ["--script-arg", arg]
    return cmd


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the child and anything it left behind in its process group (e.g. compile workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


INTERRUPT_GRACE_S = 60.0  # how long a child stopped with SIGINT may take to write what it gathered


@dataclass
class EarlyStop:
    """Stop a child gracefully (SIGINT to its process group, then up to `grace_s` to write its results) at the
    time limit, or as soon as `when` holds for a line of its output; `reason` then says which stopped it."""

    when: Callable[[str], bool] | None = None
    grace_s: float = INTERRUPT_GRACE_S
    reason: str | None = None


def run_child(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    progress: Progress = _quiet,
    cancel: threading.Event | None = None,
    early: EarlyStop | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, bool]:
    """Run `cmd` in its own process group, streaming its output to `log_path` and `progress`.

    Returns (exit code, timed out). Setting `cancel` stops the child early (CancelledCapture). With `early`,
    the time limit and `early.when` stop it gracefully, so that it can keep what it gathered (`early.reason`
    is then "timeout" or "condition"). The child and everything it started are gone when this returns.
    `env` replaces the inherited environment (output is unbuffered either way).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    interrupted_at: float | None = None
    pending = ""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), False)
            while True:
                chunk = proc.stdout.readline()
                if chunk:
                    log.write(chunk)
                    pending += chunk
                    if pending.endswith("\n"):
                        line, pending = pending.rstrip(), ""
                        progress(line)
                        if early and early.when and interrupted_at is None and early.when(line):
                            early.reason = "condition"
                            interrupted_at = _interrupt(proc)
                    continue
                if proc.poll() is not None:
                    rest = proc.stdout.read() or ""
                    log.write(rest)
                    break
                now = time.monotonic()
                if interrupted_at is not None and now > interrupted_at + (early.grace_s if early else 0):
                    break
                if now > deadline and interrupted_at is None:
                    timed_out = True
                    if early is None:
                        break
                    early.reason = "timeout"
                    interrupted_at = _interrupt(proc)
                if cancel is not None and cancel.is_set():
                    raise CancelledCapture("capture cancelled", "")
                time.sleep(0.05)
        finally:
            if pending:
                progress(pending.rstrip())
            _kill_group(proc)
    return proc.returncode, timed_out


def _interrupt(proc: subprocess.Popen[str]) -> float:
    """SIGINT to the child's process group (a profiler then writes what it gathered); when it was sent."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    return time.monotonic()


def read_harness_result(pass_dir: Path) -> dict:
    """harness.json of a pass, or a CaptureFailed naming the log to read."""
    path = pass_dir / "harness.json"
    if not path.is_file():
        raise CaptureFailed(
            f"the harness wrote no result in {pass_dir}", f"read {pass_dir / 'output.log'} for what the child printed"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def raise_for_harness(result: dict, req: CaptureRequest, pass_dir: Path) -> None:
    """Turn a harness error into a one-line WorkloadError with the remedy and the traceback's tail."""
    if result.get("status") == "ok":
        return
    error = result.get("error", {})
    kind, message = error.get("kind"), error.get("message", "unknown error")
    if kind == "no_torch":
        raise WorkloadError(message, "pass --python PATH to an interpreter that has torch, or install torch there")
    if kind == "contract":
        raise WorkloadError(message, "see README: workload contract")
    if kind == "not_cached":
        raise NotCached(message)
    tail = error.get("traceback_tail", "").strip().splitlines()
    where = f" (last lines: {' | '.join(line.strip() for line in tail[-3:])})" if tail else ""
    raise WorkloadError(
        f"the workload raised {message} during {result.get('phase', 'run')}{where}",
        f"fix the workload; full output in {pass_dir / 'output.log'}",
    )


def run_pass(
    req: CaptureRequest,
    name: str,
    profiler: str,
    prefix: list[str] | None = None,
    progress: Progress = _quiet,
    cancel: threading.Event | None = None,
    early: EarlyStop | None = None,
) -> tuple[PassRecord, dict]:
    """Run one harness pass into RUN_DIR/<name>/, optionally under a profiler prefix; return record and result.

    With `early`, a pass stopped at its time limit or by `early.when` is not a failure: its record says
    `stopped_early` and the result is empty (the harness never finished); the caller keeps what it gathered.
    """
    pass_dir = req.run_dir / name
    pass_dir.mkdir(parents=True, exist_ok=True)
    (pass_dir / "harness.json").unlink(missing_ok=True)
    cmd = [*(prefix or []), *harness_command(req, profiler, pass_dir)]
    env = interpreter_env(req.python)
    started, t0 = now_iso(), time.monotonic()
    code, timed_out = run_child(cmd, pass_dir / "output.log", req.timeout_s, progress, cancel, early, env=env)
    wall = time.monotonic() - t0
    if timed_out and early is None:
        raise CaptureFailed(
            f"the {name} pass ran past its {req.timeout_s:.0f} s limit and was stopped",
            "raise --timeout, or shrink the workload's sizes",
        )
    record = PassRecord(
        name=name, profiler=profiler, command=cmd, directory=name, started_at=started,
        wall_time_s=round(wall, 3), exit_code=code,
    )
    if uses_cache(req.python):
        record.notes.append(f"bytecode cached in {env['PYTHONPYCACHEPREFIX']} (the environment forbids writing it)")
    if early is not None and early.reason is not None:
        record.stopped_early = early.reason
        return record, {}
    result = read_harness_result(pass_dir)
    raise_for_harness(result, req, pass_dir)
    record.artifacts = [f"{name}/{a}" for a in ["harness.json", *result.get("artifacts", [])]]
    return record, result
