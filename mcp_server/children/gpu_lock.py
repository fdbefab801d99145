"""The GPU lock: the passes of one run take the GPU in turn through one lock file (standard library only)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any

POLL_S = 0.05


class GpuPhases:
    """The passes of one run (nsys, ncu, ncu's shape variants) take the GPU in turn, through one lock file.

    Building the model takes the lock shared at once. A pass given `after` compiles and warms up only once
    that file exists: the previous pass's window is done, and the Triton configurations it autotuned are in
    Inductor's cache, so every pass runs the same kernels (autotuning under ncu would time configurations
    differently). Compiling and warming up take the lock shared, the window takes it exclusively; a pass given
    `done` writes that file after its window. A pass that warms up `early` (nothing in it autotunes: eager with
    cuDNN's autotuner off, or a compile that may only reuse Inductor's cache) does so at once, beside the
    previous pass's build and warm-up, or, given `ready`, once that file exists (the first compiling pass's
    window is done: Inductor's cache holds its graphs); only its window waits for `after`.
    """

    def __init__(self, path: Path | None, after: Path | None = None, done: Path | None = None,
                 ready: Path | None = None) -> None:
        self._path, self._after, self._done, self._ready = path, after, done, ready
        self._file: Any = None

    def build(self) -> None:
        """Take the lock shared: build the model while no other pass measures."""
        if self._file is None:
            self._take("LOCK_SH")

    def warmup(self, early: bool = False) -> None:
        """Wait for the previous pass's window (not holding the lock), then take it shared: compile, warm up.
        An `early` pass waits only for `ready`, if given: nothing autotunes in its warm-up."""
        self._wait_for(self._ready if early else self._after)
        self.build()

    def window(self) -> None:
        """Take the lock exclusively for the measured window (an `early` pass after the previous pass's)."""
        self._wait_for(self._after)
        self._drop()
        self._take("LOCK_EX")

    def _wait_for(self, marker: Path | None) -> None:
        """Until `marker` exists, not holding the lock."""
        if marker is not None and not marker.exists():
            self._drop()
            while not marker.exists():
                time.sleep(POLL_S)

    def release(self) -> None:
        """Drop the lock and mark this pass's window done."""
        held = self._file is not None
        self._drop()
        if held and self._done is not None:
            self._done.touch()

    def close(self) -> None:
        """Drop the lock without marking a window done (the script never opened one)."""
        self._drop()

    def _take(self, mode: str) -> None:
        if self._path is None:
            return
        import fcntl

        self._file = open(self._path, "a+")  # noqa: SIM115 - held across phases, closed in _drop()
        fcntl.flock(self._file.fileno(), getattr(fcntl, mode))

    def _drop(self) -> None:
        if self._file is not None:
            import fcntl

            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class GpuTurns:
    """Processes that compile side by side and measure one at a time, through one lock file and a turnstile.

    Building, compiling and warming up take the GPU shared; a timed window takes it exclusively. A process waiting
    for its window holds the turnstile, which every process must pass to take the GPU shared: no warm-up starts
    while a window waits, so windows are never starved by a stream of compiles, and none runs beside GPU work of
    another process. Without a path, nothing is locked.
    """

    def __init__(self, path: Path | None) -> None:
        self._gpu = _Flock(path)
        self._turnstile = _Flock(path.with_name(path.name + ".turnstile") if path is not None else None)

    def shared(self) -> None:
        """Take the GPU shared (after any window that waits)."""
        self._gpu.drop()
        self._turnstile.take("LOCK_EX")
        self._gpu.take("LOCK_SH")
        self._turnstile.drop()

    def exclusive(self) -> None:
        """Take the GPU alone, once the processes warming up now are done; none starts meanwhile."""
        self._gpu.drop()
        self._turnstile.take("LOCK_EX")
        self._gpu.take("LOCK_EX")
        self._turnstile.drop()

    def release(self) -> None:
        """Drop the GPU."""
        self._gpu.drop()


class _Flock:
    """One lock file, taken and dropped."""

    def __init__(self, path: Path | None) -> None:
        self._path: Path | None = path
        self._file: IO[str] | None = None

    def take(self, mode: str) -> None:
        if self._path is None:
            return
        import fcntl

        self._file = open(self._path, "a+")  # noqa: SIM115 - held until drop()
        fcntl.flock(self._file.fileno(), getattr(fcntl, mode))

    def drop(self) -> None:
        if self._file is not None:
            import fcntl

            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
