"""The environment of a child that runs the workload's interpreter, with a bytecode cache where it has none.

Every pass of a run starts a fresh interpreter that imports torch, Dynamo and Inductor. An environment that
forbids writing bytecode (`PYTHONDONTWRITEBYTECODE`, common in container images) and ships none makes each of
them compile those sources again: on the H100 machine's image, `import torch` took 4 s and Dynamo's import
another 5 to 7 s in every pass, most of it compiling. Such children get a bytecode cache of their own
(`PYTHONPYCACHEPREFIX`, outside the user's tree), so the sources compile once across passes and runs.
`OPERATOR_PROFILER_BYTECODE_CACHE=off` keeps the environment exactly as it is.

The first run on such a machine has an empty cache: each pass would compile the same few thousand sources one by
one (ResNet-50 on the H100 machine: ncu measured at 14 s instead of 6 s). `precompiling` runs the child
`precompile` beside the passes: it compiles them into the cache in parallel workers, in the order the passes
import them, and does nothing once torch's bytecode is cached.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from mcp_server.errors import CancelledCapture
from mcp_server.process.child import run_child
from mcp_server.process.child_scripts import child_command
from mcp_server.progress import Progress, quiet

OPT_OUT = "OPERATOR_PROFILER_BYTECODE_CACHE"
RESERVED_CPUS = 4  # the passes of a run, one interpreter each, keep these CPUs
MIN_WORKERS = 2  # fewer CPUs to spare: the passes compile what they import themselves
PRECOMPILE_LIMIT_S = 120.0
WORKERS_ENV = "OPERATOR_PROFILER_PRECOMPILE_WORKERS"
# Whether torch's own __init__ has bytecode beside its source: found without importing torch.
_PROBE = (
    "import importlib.util as u, os; s = u.find_spec('torch'); "
    "print(bool(s and s.origin and os.path.exists(u.cache_from_source(s.origin))))"
)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the bytecode cache lives: $XDG_CACHE_HOME/operator-profiler/pycache (~/.cache by default)."""
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "operator-profiler" / "pycache"


def cache_bytes(folder: Path) -> int:
    """How many bytes of bytecode the cache at `folder` holds (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


@functools.lru_cache(maxsize=8)
def torch_bytecode_cached(python: str) -> bool:
    """Whether `python` finds torch with its bytecode already written beside the source (True when unknown)."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return proc.stdout.strip() != "False"


def uses_cache(python: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether children running `python` get the bytecode cache: writing bytecode is forbidden, no prefix is
    set, torch has none compiled, and the user did not opt out."""
    return (
        bool(environ.get("PYTHONDONTWRITEBYTECODE"))
        and not environ.get("PYTHONPYCACHEPREFIX")
        and environ.get(OPT_OUT, "").lower() != "off"
        and not torch_bytecode_cached(python)
    )


def interpreter_env(python: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a child running `python`: unbuffered output, and the bytecode cache when it applies."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if uses_cache(python, environ):
        env.pop("PYTHONDONTWRITEBYTECODE")
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir(environ))
    return env


def asked_workers(environ: Mapping[str, str] = os.environ) -> int | None:
    """The precompile's workers as $OPERATOR_PROFILER_PRECOMPILE_WORKERS sets them (0: none), if it does."""
    asked = environ.get(WORKERS_ENV, "").strip()
    return int(asked) if asked.isdigit() else None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def precompile_workers(environ: Mapping[str, str] = os.environ, passes: int = RESERVED_CPUS) -> int:
    """How many worker processes compile bytecode beside a run's passes: `asked_workers`, else the CPUs this
    process may use, less one per pass running at once (`passes`, at least `RESERVED_CPUS`: a multi-rank pass
    runs one interpreter per rank); 0 when fewer than `MIN_WORKERS` remain."""
    asked = asked_workers(environ)
    if asked is not None:
        return asked
    workers = usable_cpus() - max(passes, RESERVED_CPUS)
    return workers if workers >= MIN_WORKERS else 0


class Precompile:
    """The child `precompile` under the workload's interpreter, in a thread: it compiles torch's, its
    dependencies' and the workload's sources into the bytecode cache while the passes start."""

    def __init__(self, python: str, workload: Path, log: Path, compiling: bool, workers: int,
                 progress: Progress = quiet, done: Path | None = None) -> None:
        args = ["--workload", str(workload), "--workers", str(workers), "--since", f"{time.time():.3f}"]
        if compiling:
            args.append("--compiler")
        self.command = child_command(python, "precompile", *args)
        self.log, self.progress, self.done = log, progress, done
        self.env = interpreter_env(python)
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bytecode-precompile", daemon=True)

    def _run(self) -> None:
        try:
            run_child(self.command, self.log, PRECOMPILE_LIMIT_S, self.progress, self._cancel, env=self.env)
        except CancelledCapture:
            pass  # stopped once the passes it served were done
        finally:
            if self.done is not None:  # the timing pass's window waits for it: no compile beside that window
                self.done.touch()

    def start(self) -> Precompile:
        """Start the child; it runs beside whatever starts next."""
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the child to end by itself, up to `timeout` seconds; whether it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop(self) -> None:
        """Stop the child if it still runs (the passes it served are done), and wait for it."""
        self._cancel.set()
        self._thread.join()

    def summary(self) -> str | None:
        """What the child said it compiled, when it compiled anything."""
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        done = [ln for ln in lines if ln.startswith("precompiled ")]
        return done[-1] if done else None


def precompile_notes(precompile: Precompile | None, run_dir: Path, beside: str = "the passes") -> list[str]:
    """The manifest's note on what `precompile` compiled beside `beside`, its log named relative to `run_dir`;
    none when it did not run or compiled nothing."""
    summary = precompile.summary() if precompile is not None else None
    if precompile is None or summary is None:
        return []
    log = precompile.log.relative_to(run_dir).as_posix()
    return [f"bytecode: {summary}, beside {beside} (no bytecode was cached; see {log})"]


@contextlib.contextmanager
def precompiling(python: str, workload: Path, log: Path, compiling: bool, progress: Progress = quiet,
                 workers: int | None = None, done: Path | None = None) -> Iterator[Precompile | None]:
    """Compile the bytecode the passes will import, beside the body, where they get the bytecode cache and
    the machine has CPUs to spare (`workers`: default `precompile_workers()`); the child is stopped and waited
    for when the body ends. `compiling`: the passes run torch.compile (its packages are compiled too). `done`
    is written once the child has ended."""
    workers = precompile_workers() if workers is None else workers
    if not (workers and uses_cache(python)):
        yield None
        return
    job = Precompile(python, workload, log, compiling, workers, progress, done).start()
    try:
        yield job
    finally:
        job.stop()
