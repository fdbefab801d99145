"""Two measurement processes timing in turns, block by block: bench's interleaved round (`--interleave`).

A host-bound call (Python, guards, CUDA-graph bookkeeping) runs as fast as the host does, and on a shared machine
that moves by up to 2x within seconds (`docs/measurements/`, the H200's process spread): two processes timed one
after the other each draw their own host. So a round starts both sides' processes at once, each in its own
interpreter (nothing compiled, captured or allocated is shared); they build, compile and warm up side by side, with
nothing timed, then each says `ready` and waits on its FIFO (`children/measure.py --turns`). The conductor hands
out the timed blocks one at a time, A B B A A B …, the first side flipped every round: never two timed at once, and
each block next to a block of the other side, which saw the same host. A side that fails stops the other.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mcp_server.errors import CancelledCapture, WorkloadError
from mcp_server.progress import Progress, quiet
from mcp_server.proof.measure import MARKER, Measured

READY = f"{MARKER} ready"
BLOCK_DONE = re.compile(rf"{re.escape(MARKER)} block (\d+) done")
POLL_S = 0.05

# One side's measurement: called with its FIFO, its progress and the event that stops it; returns its result.
Measure = Callable[[Path, Progress, threading.Event], Measured]


def block_order(sides: tuple[str, str], blocks: int, round_index: int) -> list[str]:
    """The sides' timed blocks in turn order: pairs A B, B A, A B …, the first pair's order flipped every round."""
    first = sides if round_index % 2 == 0 else sides[::-1]
    order: list[str] = []
    for k in range(blocks):
        order += list(first if k % 2 == 0 else first[::-1])
    return order


@dataclass
class _Side:
    """One side's process, seen from the conductor."""

    name: str
    fifo: Path
    ready: threading.Event = field(default_factory=threading.Event)
    done: queue.Queue[int] = field(default_factory=queue.Queue)
    finished: threading.Event = field(default_factory=threading.Event)
    result: Measured | None = None
    error: BaseException | None = None
    fd: int | None = None

    def watch(self, progress: Progress) -> Progress:
        """The child's output lines: `ready` and `block K done` noted, every line passed on."""
        def take(line: str) -> None:
            if line.strip() == READY:
                self.ready.set()
            elif (m := BLOCK_DONE.match(line.strip())) is not None:
                self.done.put(int(m.group(1)))
            progress(line)
        return take

    def go(self) -> None:
        """Hand this side its next block: one byte on its FIFO (which the child holds open once ready)."""
        if self.fd is None:
            self.fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(self.fd, b"g")

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


class _Stopped(Exception):
    """A side ended (failed or stopped) before the conductor was done with it."""


def measure_in_turns(
    measures: dict[str, Measure],
    scratch: Path,
    blocks: int,
    round_index: int,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    after_first_block: Callable[[], None] | None = None,
) -> tuple[dict[str, Measured], list[str]]:
    """Run both sides' measurements at once, their timed blocks in turn (`block_order`); their results and the
    order the blocks ran in. A side's error is raised once both processes are gone (the other is stopped);
    `cancel` stops both (CancelledCapture). `after_first_block` runs between the first block and the second, both
    processes waiting (bench reads the GPU's clocks there)."""
    names = tuple(measures)
    if len(names) != 2:
        raise ValueError("turns take exactly two sides")
    stop = threading.Event()
    sides = {name: _Side(name, scratch / f"turns_round{round_index + 1}_{name}.fifo") for name in names}
    for side in sides.values():
        side.fifo.unlink(missing_ok=True)
        os.mkfifo(side.fifo)
    threads = [threading.Thread(target=_run_side, args=(side, measures[side.name], progress, stop),
                                name=f"bench-{side.name}", daemon=True) for side in sides.values()]
    order = block_order((names[0], names[1]), blocks, round_index)
    ended: str | None = None
    conducted = False
    try:
        for thread in threads:
            thread.start()
        _conduct(sides, order, cancel, after_first_block)
        conducted = True
    except _Stopped as exc:
        ended = str(exc)
    finally:
        if not conducted:  # a side ended, cancelled, or an error here: no process waits for a turn that never comes
            stop.set()
        for thread in threads:
            while thread.is_alive():
                thread.join(POLL_S)
                if cancel is not None and cancel.is_set():
                    stop.set()
        for side in sides.values():
            side.close()
            side.fifo.unlink(missing_ok=True)
    if cancel is not None and cancel.is_set():
        raise CancelledCapture("bench cancelled", "")
    failed = [s.error for s in sides.values() if s.error is not None and not isinstance(s.error, CancelledCapture)]
    if failed:
        raise _remedied(failed[0])
    results = {name: side.result for name, side in sides.items() if side.result is not None}
    if ended is not None or len(results) != len(sides):
        raise WorkloadError(f"the {ended or 'other'} side's measurement process ended before its timed blocks",
                            "run bench without --interleave to see that side measured alone, and report this")
    return results, order


def _remedied(error: BaseException) -> BaseException:
    """A side's error; out of memory also says that the two sides' models were on the GPU at once."""
    if isinstance(error, WorkloadError) and "out of memory" in error.message.lower():
        error.remedy = ("in turns, both sides' processes hold their model at once: run bench without --interleave "
                        f"(one process at a time); {error.remedy}")
    return error


def _run_side(side: _Side, measure: Measure, progress: Progress, stop: threading.Event) -> None:
    try:
        side.result = measure(side.fifo, side.watch(progress), stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the conductor's thread, raised there
        side.error = exc
    finally:
        side.finished.set()


def _conduct(sides: dict[str, _Side], order: list[str], cancel: threading.Event | None,
             after_first_block: Callable[[], None] | None) -> None:
    """Wait until both sides are ready, then hand out the blocks one at a time, each after the previous is done.
    _Stopped (with the side's name) when a side ends while blocks are still owed to it, or on `cancel`."""
    owed = {name: order.count(name) for name in sides}
    for side in sides.values():
        _wait(side.ready.is_set, sides, owed, cancel)
    for turn, name in enumerate(order):
        side = sides[name]
        try:
            side.go()
        except OSError as exc:  # the child closed its end: it is gone
            side.finished.wait()
            raise _Stopped(name) from exc
        block = order[: turn + 1].count(name)
        _wait(functools.partial(_took, side, block), sides, owed, cancel)
        owed[name] -= 1
        if turn == 0 and after_first_block is not None:
            after_first_block()


def _took(side: _Side, block: int) -> bool:
    try:
        return side.done.get_nowait() >= block
    except queue.Empty:
        return False


def _wait(condition: Callable[[], bool], sides: dict[str, _Side], owed: dict[str, int],
          cancel: threading.Event | None) -> None:
    """Until `condition` holds. _Stopped when a side that still owes blocks has ended, or on `cancel`."""
    while not condition():
        if cancel is not None and cancel.is_set():
            raise _Stopped("cancelled")
        gone = [s.name for s in sides.values() if s.finished.is_set() and owed[s.name] > 0]
        if gone:
            if condition():
                return
            raise _Stopped(gone[0])
        for side in sides.values():
            side.finished.wait(POLL_S / len(sides))
