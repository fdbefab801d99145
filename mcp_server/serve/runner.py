"""Run a blocking engine call from an async tool: worker thread, progress per phase, cancellation, timeout.

The engine is synchronous and starts child processes through `run_child`, which stops its child (and the
child's process group) when a `threading.Event` is set. A tool's work runs in a worker thread; when the
request is cancelled or runs past its limit, the event is set and the tool waits for the thread to return,
so no child outlives the request. The worker never waits on the event loop: phase lines go through a queue
that the tool's own task forwards as progress notifications. Engine errors become `ToolError`s carrying
their remedy.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ClientCapabilities, RootsCapability

from mcp_server.errors import ProfilerError, from_os_error
from mcp_server.progress import Progress, is_phase
from mcp_server.serve.wording import mcp_words

T = TypeVar("T")
Work = Callable[[Progress, threading.Event], T]

logger = logging.getLogger("operator_profiler.mcp")

STOP_GRACE_S = 30.0
PROGRESS_POLL_S = 0.1
# (cancel, finished) of every engine call in flight, so that a server shutting down can stop them all.
_IN_FLIGHT: set[tuple[threading.Event, threading.Event]] = set()
_IN_FLIGHT_LOCK = threading.Lock()


class ProgressRelay:
    """The progress sink the engine calls from the worker thread; phase lines are queued for the client."""

    def __init__(self, tool: str) -> None:
        self._tool = tool
        self._queue: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.sent = 0

    def __call__(self, line: str) -> None:
        if not is_phase(line):
            logger.debug("%s | %s", self._tool, line)
            return
        logger.info("%s: %s", self._tool, line)
        self._queue.put(line)

    async def flush(self, ctx: Context[Any, Any]) -> None:
        """Send every queued phase line as a progress notification (a lost one never fails the call)."""
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return
            self.sent += 1
            try:
                await ctx.report_progress(float(self.sent), None, line)
            except Exception as exc:  # noqa: BLE001 - progress is best effort
                logger.debug("progress notification not sent: %r", exc)

    async def forward(self, ctx: Context[Any, Any], done: anyio.Event) -> None:
        """Flush the queue every PROGRESS_POLL_S until `done`, then once more."""
        while not done.is_set():
            await self.flush(ctx)
            with anyio.move_on_after(PROGRESS_POLL_S):
                await done.wait()
        await self.flush(ctx)


async def run_engine(ctx: Context[Any, Any] | None, tool: str, work: Work[T], timeout_s: float) -> T:
    """Run `work(progress, cancel)` in a worker thread and return its result.

    Cancellation of the request and `timeout_s` both set `cancel` and wait (shielded, up to STOP_GRACE_S)
    for `work` to return, which `run_child` makes prompt. ProfilerError becomes ToolError(one_line()).
    """
    cancel, finished = threading.Event(), threading.Event()
    relay = ProgressRelay(tool)
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, work(relay, cancel)))
        except BaseException as exc:  # noqa: BLE001 - handed back to the tool's task below
            outcome.append((False, exc))
        finally:
            finished.set()

    with _IN_FLIGHT_LOCK:
        _IN_FLIGHT.add((cancel, finished))
    try:
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:
                done = anyio.Event()
                if ctx is not None:
                    tg.start_soon(relay.forward, ctx, done)
                try:
                    await anyio.to_thread.run_sync(target, abandon_on_cancel=True)
                finally:
                    done.set()
        if not outcome:
            raise ToolError(f"{tool} ran past the tool's {timeout_s:.0f} s limit and was stopped — pass a larger "
                            "timeout_s, or shrink the workload")
        succeeded, value = outcome[0]
        if succeeded:
            return value
        if isinstance(value, OSError):
            value = from_os_error(value)
        if isinstance(value, ProfilerError):
            raise ToolError(mcp_words("\n".join([value.one_line(), *value.details]))) from value
        raise value
    finally:
        if not finished.is_set():
            cancel.set()
            logger.info("%s: stopping (cancelled or timed out); waiting for its children to exit", tool)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(finished.wait, STOP_GRACE_S)
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.discard((cancel, finished))


async def client_roots(ctx: Context[Any, Any] | None) -> tuple[Path, ...]:
    """The folders the client declared as its roots (`roots/list`), when it declares the capability; none else."""
    if ctx is None:
        return ()
    try:
        session = ctx.session
        if not session.check_client_capability(ClientCapabilities(roots=RootsCapability())):
            return ()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # roots are deprecated from protocol 2026-07-28; older clients send them
            listed = await session.list_roots()
    except Exception as exc:  # noqa: BLE001 - a client that cannot answer has no roots to add
        logger.debug("roots/list failed: %r", exc)
        return ()
    return tuple(Path(unquote(urlparse(str(root.uri)).path)) for root in listed.roots
                 if str(root.uri).startswith("file://"))


def stop_all(grace_s: float = STOP_GRACE_S) -> int:
    """Cancel every engine call in flight and wait (up to `grace_s`) until their children are gone.

    For a server that is shutting down outside the event loop (SIGTERM): returns how many calls were stopped.
    """
    with _IN_FLIGHT_LOCK:
        calls = list(_IN_FLIGHT)
    for cancel, _ in calls:
        cancel.set()
    deadline = time.monotonic() + grace_s
    for _, finished in calls:
        finished.wait(max(0.0, deadline - time.monotonic()))
    return len(calls)
