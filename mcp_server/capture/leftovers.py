"""What a run stopped before it finished leaves behind, found and cleaned by the next run.

A run directory's lock file records the engine writing it and the tag its children carry (`RunDir.locked`), and the
record is cleared when the run ends. An engine killed outright (SIGKILL, the OOM killer) leaves the record: the
next run that takes the lock, or that starts beside it under the same `op_runs/`, says so, stops any process of that
tag still running (the children stop themselves when their engine dies; this is the second line) and removes the
scratch files (GPU-turn markers, temporary files of interrupted writes).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from mcp_server.errors import UsageError
from mcp_server.process.child import ENGINE_TOKEN, now_iso, stop_tagged
from mcp_server.progress import Progress
from mcp_server.rundir import RUNS_FOLDER, RunDir
from mcp_server.schema.manifest import RunOwner


def owner(verb: str) -> RunOwner:
    """The record this engine leaves in a run directory's lock while `verb` writes it."""
    return RunOwner(pid=os.getpid(), tag=ENGINE_TOKEN, verb=verb, started_at=now_iso())


def clean(run_dir: RunDir, stopped_run: RunOwner) -> str:
    """Stop what the stopped run left running and remove its scratch files; what was found, in one sentence."""
    stopped = stop_tagged(f"{stopped_run.tag}.", prefix=True) if stopped_run.tag else []
    scratch = run_dir.scratch_files()
    for path in scratch:
        with contextlib.suppress(OSError):
            path.unlink()
    who = f"pid {stopped_run.pid}, {stopped_run.verb} started {stopped_run.started_at}" if stopped_run.pid else \
        "its lock record unreadable"
    found = [f"stopped {len(stopped)} of its processes still running ({', '.join(stopped[:3])})" if stopped else
             "none of its processes was still running"]
    if scratch:
        found.append(f"removed {len(scratch)} scratch file(s)")
    return f"a run in {run_dir.path} ({who}) was stopped before it finished: {'; '.join(found)}"


def taken_over(run_dir: RunDir, verb: str, progress: Progress) -> list[str]:
    """After taking `run_dir`'s lock for `verb`: the warning about the run before, when it was stopped before it
    finished (its processes stopped, its scratch files removed)."""
    if run_dir.interrupted is None:
        return []
    said = clean(run_dir, run_dir.interrupted)
    run_dir.interrupted = None
    progress(f"{verb}: {said}")
    return [said]


def stopped_beside(project: Path, verb: str, progress: Progress) -> list[str]:
    """Every run directory under `<project>/op_runs/` whose run was stopped before it finished: each cleaned (its
    partial output kept) and said once (its record is cleared)."""
    said = []
    for lock in sorted((Path(project) / RUNS_FOLDER).glob(f"*/{RunDir.LOCK}")):
        run_dir = RunDir(lock.parent)
        if run_dir.owner() is None:
            continue
        try:
            with run_dir.locked():
                if run_dir.interrupted is not None:
                    said.append(clean(run_dir, run_dir.interrupted) + " (its partial output is kept)")
                    progress(f"{verb}: {said[-1]}")
        except (UsageError, OSError):
            continue  # in use by a running run, or gone meanwhile: not ours to clean
    return said
