"""Run as a script, a child finds its own package and nothing else of the engine's environment.

The child scripts run as files under the workload's interpreter, with their folder first on sys.path. Importing
this module takes that folder off sys.path (nothing here may shadow the workload's own modules) and registers
`mcp_server` and `mcp_server.children` from the files beside it, so `from mcp_server.children.common import ...`
works whether or not the workload's environment has Operator Profiler installed, without exposing the rest of
the engine's site-packages. The unusual name keeps it from shadowing a workload module in turn.

It also ties the child to the engine that started it: a thread waits for the engine's exit (a pidfd, which never
names a reused pid) and, whatever ended the engine (SIGKILL and the OOM killer included), stops every process of
this child's run tag, wherever it moved (its process group, a session of its own), then this process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import select
import signal
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


def _register(name: str, folder: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {folder}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_register("mcp_server", os.path.dirname(_HERE))
_register("mcp_server.children", _HERE)


from mcp_server.children.contract import ENGINE_PID_ENV, RUN_TAG_ENV, tagged_processes  # noqa: E402

POLL_S = 0.5  # where pidfds are missing (Linux < 5.3, Python < 3.9): how often the engine is looked for


def _engine_gone(engine: int, tag: str) -> None:
    """The engine is gone: kill every process of this run's tag, then this process's group (this process too)."""
    try:
        sys.stderr.write(f"[operator-profiler] the engine (pid {engine}) is gone: stopping this run's processes\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # its pipe died with it
    for _ in range(10):
        others = tagged_processes(tag)
        if not others:
            break
        for pid in others:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(137)


def _wait_for(engine: int, tag: str, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])  # readable once the engine has exited
    else:
        while True:
            try:
                os.kill(engine, 0)
            except ProcessLookupError:
                break
            except OSError:
                pass
            time.sleep(POLL_S)
    _engine_gone(engine, tag)


def watch_engine() -> None:
    """Start the thread that stops this run's processes once the engine that started this child exits."""
    tag, engine_pid = os.environ.get(RUN_TAG_ENV), os.environ.get(ENGINE_PID_ENV, "")
    if not tag or not engine_pid.isdigit() or int(engine_pid) <= 1:
        return  # not started by the engine (a test, a user running the script by hand)
    engine = int(engine_pid)
    pidfd = None
    try:
        pidfd = os.pidfd_open(engine)
    except ProcessLookupError:
        _engine_gone(engine, tag)
    except (AttributeError, OSError):
        pidfd = None
    threading.Thread(target=_wait_for, args=(engine, tag, pidfd), name="operator-profiler-engine", daemon=True).start()


watch_engine()
