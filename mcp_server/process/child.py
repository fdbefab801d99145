"""Run one child process: its own process group, output streamed to a log and a progress sink, a time limit,
cancellation, and a graceful stop that lets a profiler keep what it gathered. Argument lists only, never a
shell string; the child and everything it started are gone when `run_child` returns."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from mcp_server.errors import CancelledCapture
from mcp_server.progress import Progress, quiet

INTERRUPT_GRACE_S = 60.0  # how long a child stopped with SIGINT may take to write what it gathered
KILL_GRACE_S = 5.0  # how long a child has to exit after SIGTERM before SIGKILL
POLL_S = 0.05


def now_iso() -> str:
    """UTC timestamp with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class EarlyStop:
    """Stop a child gracefully (SIGINT to its process group, then up to `grace_s` to write its results) at the
    time limit, or as soon as `when` holds for a line of its output; `reason` then says which stopped it."""

    when: Callable[[str], bool] | None = None
    grace_s: float = INTERRUPT_GRACE_S
    reason: str | None = None


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Stop the child and anything it left behind in its process group (e.g. compile workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _interrupt(proc: subprocess.Popen[str]) -> float:
    """SIGINT to the child's process group (a profiler then writes what it gathered); when it was sent."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    return time.monotonic()


def run_child(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    progress: Progress = quiet,
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
                time.sleep(POLL_S)
        finally:
            if pending:
                progress(pending.rstrip())
            kill_group(proc)
    return proc.returncode, timed_out
