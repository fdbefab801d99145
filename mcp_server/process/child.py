"""Run one child process: its own process group, output streamed to a capped log and a progress sink, a time
limit and cancellation checked on every turn, and a graceful stop that lets a profiler keep what it gathered.

Argument lists only, never a shell string. The child and everything it started are gone when `run_child`
returns; children still running when the process ends (a signal, an exception in another thread) are killed
by `stop_children`, which the faces call on SIGTERM/SIGHUP and at exit.

Every child carries a tag in its environment (`RUN_TAG_ENV`, inherited by all it starts) and the engine's pid:
what the workload left running outside the child's process group (a daemon in a session of its own) is found by
that tag once the child has ended, stopped and named; and when the engine itself dies, even by SIGKILL, the
child's bootstrap stops every process of the tag (`children/_operator_profiler_child.py`).
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import itertools
import os
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType

from mcp_server.children.contract import ENGINE_PID_ENV, RUN_TAG_ENV, process_command, process_group, tagged_processes
from mcp_server.errors import CancelledCapture
from mcp_server.progress import Progress, quiet

INTERRUPT_GRACE_S = 60.0  # how long a child stopped with SIGINT may take to write what it gathered
KILL_GRACE_S = 5.0  # how long a child has to exit after SIGTERM before SIGKILL
GROUP_GONE_S = 2.0  # how long the rest of a killed group has to die (SIGKILL lands when they are next scheduled)
POLL_S = 0.05
DRAIN_S = 2.0  # how long output is still read once the child has exited (its workers may write on)
READ_BYTES = 1 << 16
LOG_LIMIT_ENV = "OPERATOR_PROFILER_LOG_LIMIT_MB"
DEFAULT_LOG_LIMIT_MB = 64
LOG_TAIL_LINES = 5
TAIL_BYTES = 1 << 14

STRAY_GRACE_S = 1.0  # how long a process left behind has to exit after SIGTERM

_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()
ENGINE_TOKEN = f"{os.getpid()}-{secrets.token_hex(4)}"  # the start of every tag this process gives its children
_TAGS = itertools.count(1)


def new_tag() -> str:
    """A tag for one child and everything it starts: `<engine token>.<n>`."""
    return f"{ENGINE_TOKEN}.{next(_TAGS)}"


def stop_tagged(tag: str, prefix: bool = False, spare_group: int | None = None) -> list[str]:
    """Stop every process carrying `tag` (with `prefix`, any tag starting with it): SIGTERM, then SIGKILL after
    STRAY_GRACE_S. Returns what was stopped, `pid (command line)`, leaving out members of process group
    `spare_group` (the child's own group, being stopped already: not strays)."""
    found = {pid: (process_command(pid), process_group(pid)) for pid in tagged_processes(tag, prefix)}
    if not found:
        return []
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STRAY_GRACE_S
    while (left := tagged_processes(tag, prefix)) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return [f"{pid} ({command or 'exited'})" for pid, (command, group) in found.items()
            if spare_group is None or group != spare_group]


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


class Terminated(BaseException):
    """The engine's own process was asked to stop (SIGTERM, SIGHUP): unwinds like Ctrl-C, stopping children."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_description(code: int) -> str:
    """How a child ended, in words: `exit code 3`, or the signal that killed it."""
    if code > 128 and code - 128 in signal.valid_signals():  # a wrapper (nsys, a shell) saying its child was killed
        name = signal.Signals(code - 128).name
        hint = ": out of memory, or killed from outside" if code - 128 == signal.SIGKILL else ""
        return f"exited with code {code} (its workload was killed by {name}{hint})"
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    hint = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
    return f"was killed by {name}{hint}"


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last non-empty lines of a child's log, joined with ' | ' (read from its end: a log may be large)."""
    try:
        with open(log_path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("[operator-profiler]")]
    return " | ".join(kept[-lines:])


def log_limit_bytes() -> int:
    """How much of one child's output its log keeps ($OPERATOR_PROFILER_LOG_LIMIT_MB, default 64 MB)."""
    try:
        return max(1, int(float(os.environ.get(LOG_LIMIT_ENV, DEFAULT_LOG_LIMIT_MB)) * 1024 * 1024))
    except ValueError:
        return DEFAULT_LOG_LIMIT_MB * 1024 * 1024


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the child and anything it left behind in its process group (e.g. compile or data-loader workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE_S)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with contextlib.suppress(ProcessLookupError):  # the leader is gone; its workers may not be
        os.killpg(proc.pid, signal.SIGKILL)
        _wait_group_gone(proc.pid, GROUP_GONE_S)


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    """Wait, up to `timeout_s`, until no process of group `pgid` is alive (zombies left to init do not count)."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still running, as /proc says (without /proc: no wait)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_children() -> int:
    """Kill every child process group still running; how many there were."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        kill_group(proc)
    return len(live)


@contextlib.contextmanager
def stopping_children_on_signals(*signums: signal.Signals) -> Iterator[None]:
    """In the main thread: turn `signums` (default SIGTERM, SIGHUP) into `Terminated`, so that every running call
    unwinds and stops its children; the previous handlers come back afterwards."""

    def terminate(signum: int, _frame: FrameType | None) -> None:
        raise Terminated(signum)

    wanted = signums or (signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, terminate) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


atexit.register(stop_children)


class _Log:
    """A child's log file, capped: what is over the limit is counted, and the count noted at the end."""

    def __init__(self, path: Path, limit: int) -> None:
        self.handle = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.limit, self.written, self.dropped = limit, 0, 0
        self.failed = False  # a write failed (a full disk): the rest of the output is dropped, the child runs on

    def write(self, text: str) -> None:
        room = 0 if self.failed else self.limit - self.written
        if room <= 0:
            self.dropped += len(text)
            return
        kept = text[:room]
        try:
            self.handle.write(kept)
            self.handle.flush()  # on disk as it comes: an engine killed outright leaves the log whole
        except OSError:
            self.failed = True
        self.written += len(kept)
        self.dropped += len(text) - len(kept)

    def note(self, text: str) -> None:
        """A line of the engine's own, kept whatever the limit."""
        with contextlib.suppress(OSError):
            self.handle.write(f"\n[operator-profiler] {text}\n")

    def close(self) -> None:
        if self.dropped and not self.failed:
            self.note(f"this log keeps the first {self.limit} characters of the output: {self.dropped} more were "
                      f"dropped (${LOG_LIMIT_ENV} raises the limit)")
        with contextlib.suppress(OSError):
            self.handle.close()


def run_child(
    cmd: list[str],
    log_path: Path,
    timeout_s: float,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    early: EarlyStop | None = None,
    env: Mapping[str, str] | None = None,
    stopped: list[str] | None = None,
) -> tuple[int, bool]:
    """Run `cmd` in its own process group, its output (stdout and stderr together) to `log_path` and `progress`.

    Returns (exit code, timed out); a negative code is the signal that killed it (`exit_description`). The time
    limit and `cancel` (CancelledCapture) are checked on every turn, whatever the child writes. With `early`, the
    time limit and `early.when` stop it gracefully, so that it can keep what it gathered (`early.reason` is then
    "timeout" or "condition"). Once the child has exited, what it wrote is read and the rest of its process
    group is stopped: a worker it left holding the output open does not hold this up. Processes it left running
    outside its group (found by its tag) are stopped too, each named in its log and appended to `stopped`. `env`
    replaces the inherited environment (output is unbuffered either way).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    interrupted_at: float | None = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    log = _Log(log_path, log_limit_bytes())
    tag = new_tag()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1", RUN_TAG_ENV: tag,
             ENGINE_PID_ENV: str(os.getpid())},
    )
    with _LIVE_LOCK:
        _LIVE.add(proc)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)

    def take(text: str) -> None:
        nonlocal pending, interrupted_at
        log.write(text)
        pending += text
        *lines, pending = pending.split("\n")
        for line in lines:
            line = line.rstrip("\r")
            progress(line)
            if early and early.when and interrupted_at is None and early.when(line):
                early.reason = "condition"
                interrupted_at = _interrupt(proc)

    try:
        open_pipe, exited_at = True, None
        while True:
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                raise CancelledCapture("capture cancelled", "")
            if interrupted_at is not None and now > interrupted_at + (early.grace_s if early else 0):
                break
            if now > deadline and interrupted_at is None:
                timed_out = True
                if early is None:
                    break
                early.reason = "timeout"
                interrupted_at = _interrupt(proc)
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if not open_pipe:
                if exited_at is not None:
                    break
                time.sleep(POLL_S)
                continue
            ready = selector.select(timeout=0 if exited_at is not None else POLL_S)
            data = _read(fd) if ready else None
            if data:
                take(decoder.decode(data))
            elif data == b"":  # the output's end: wait for the child itself
                open_pipe = False
                selector.unregister(fd)
            # Once the child is gone, what it wrote is read; workers it left holding the output do not hold us up.
            if exited_at is not None and (not data or now > exited_at + DRAIN_S):
                break
        take(decoder.decode(b"", final=True))
    finally:
        if pending:
            progress(pending.rstrip())
        selector.close()
        kill_group(proc)
        proc.stdout.close()
        for stray in stop_tagged(tag, spare_group=proc.pid):
            log.note(f"stopped process {stray}: left running outside the child's process group (a daemon in a "
                     "session of its own)")
            if stopped is not None:
                stopped.append(stray)
        log.close()
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return proc.returncode, timed_out


def _read(fd: int) -> bytes | None:
    """What the pipe holds now (b"" at its end), or None when nothing is there yet."""
    try:
        return os.read(fd, READ_BYTES)
    except BlockingIOError:
        return None


def _interrupt(proc: subprocess.Popen[bytes]) -> float:
    """SIGINT to the child's process group (a profiler then writes what it gathered); when it was sent."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    return time.monotonic()
