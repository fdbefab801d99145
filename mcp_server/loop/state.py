"""Recording the loop checkpoints the engine's tools write: loop_state.json, updated under a lock.

A folder is a loop folder when a workload the tool was given lies directly in it (the `/optimize` loop writes
everything beside the workload `NAME.py`), or when it already holds loop_state.json. Only there, and only for the
files named in the stage table's RECORDED set, does a tool record what it wrote; ordinary output folders (the
fresh ones under op_runs/, or any other folder) get no loop_state.json.

Two tools may finish at once in one folder: each reads, changes and writes loop_state.json while holding an
exclusive `flock` on the folder itself (no lock file is left beside the user's), and writes it atomically, so both
records are kept and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from mcp_server.errors import ProfileFormatError
from mcp_server.loop.stages import OPTIMIZATIONS, RECORDED
from mcp_server.schema.io import read_text, write_model_atomic
from mcp_server.schema.loop import LOOP_STATE_JSON, LOOP_STATE_VERSION, CheckpointRecord, InputRecord, LoopState
from mcp_server.schema.types import LoopTool

CHUNK = 1 << 20
REMEDY = f"delete {LOOP_STATE_JSON}: the loop then judges its checkpoints by modification times"


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# Fields of a plan item that the implement stage fills in: not part of what the plan asks for.
PLAN_PROGRESS_FIELDS = ("status", "status_reason")


def fingerprint(path: Path) -> str:
    """What a later stage depends on in a file, as a sha256: the bytes, except for optimizations.json, whose items'
    `status` and `status_reason` (set by the implement stage) are left out, so marking items implemented does not
    make the plan's own renderings stale. An optimizations.json that does not parse falls back to its bytes."""
    if path.name == OPTIMIZATIONS:
        try:
            plan = json.loads(path.read_text(encoding="utf-8"))
            for item in plan.get("items", []):
                for field in PLAN_PROGRESS_FIELDS:
                    item.pop(field, None)
        except (OSError, ValueError, AttributeError, TypeError):
            return sha256_of(path)
        return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    return sha256_of(path)


def now() -> str:
    """The current time, ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def state_path(folder: Path) -> Path:
    """loop_state.json of a loop folder."""
    return Path(folder) / LOOP_STATE_JSON


def is_loop_folder(folder: Path, workloads: Iterable[Path | str]) -> bool:
    """Whether a tool writing into `folder` writes loop checkpoints: a workload it was given lies directly in
    `folder`, or `folder` already holds loop_state.json."""
    folder = Path(folder).resolve()
    return state_path(folder).is_file() or any(Path(w).resolve().parent == folder for w in workloads)


def stored_name(path: Path, folder: Path) -> str:
    """How loop_state.json names a file: its name inside `folder`, else its absolute path."""
    path = Path(path).resolve()
    return path.relative_to(folder).as_posix() if path.is_relative_to(folder) else str(path)


def read_state(folder: Path) -> LoopState | None:
    """A folder's loop_state.json, or None when it has none; a corrupt one, or one of another major version, is a
    ProfileFormatError with its remedy."""
    path = state_path(folder)
    if not path.is_file():
        return None
    text = read_text(path, LOOP_STATE_JSON, REMEDY)
    try:
        data = json.loads(text)
        found = str(data.get("loop_state_version", "")) if isinstance(data, dict) else ""
        if found.split(".", 1)[0] != LOOP_STATE_VERSION.split(".", 1)[0]:
            raise ProfileFormatError(f"{path} has version {found or 'none'}; this operator-profiler reads "
                                     f"{LOOP_STATE_VERSION.split('.', 1)[0]}.x", REMEDY)
        return LoopState.model_validate(data)
    except (json.JSONDecodeError, ValidationError, RecursionError) as exc:
        raise ProfileFormatError(f"{path} is corrupt: {str(exc).splitlines()[0]}", REMEDY) from exc


@contextlib.contextmanager
def updating_state(folder: Path) -> Iterator[LoopState]:
    """Hold the folder's loop-state lock, read loop_state.json (a new one when absent), let the caller change it,
    and write it back atomically (nothing when the body raises)."""
    folder = Path(folder)
    handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the descriptor closes
        state = read_state(folder) or LoopState()
        yield state
        write_model_atomic(state_path(folder), state)
    finally:
        os.close(handle)


class Recorder:
    """The provenance of the checkpoints one tool call writes into its output folder.

    Made before the tool runs: it decides whether the folder is a loop folder and, when it is, hashes the files
    the tool reads, as they are when it reads them. `record` then records the checkpoints it wrote.
    """

    def __init__(self, folder: Path, tool: LoopTool, inputs: Iterable[Path | None],
                 workloads: Iterable[Path | str]) -> None:
        self.folder = Path(folder).resolve()
        self.tool = tool
        self.active = is_loop_folder(self.folder, workloads)
        self.inputs: list[InputRecord] = []
        if self.active:
            seen = set()
            for path in (Path(p).resolve() for p in inputs if p is not None):
                if path not in seen and path.is_file():
                    seen.add(path)
                    self.inputs.append(InputRecord(path=stored_name(path, self.folder), sha256=fingerprint(path)))

    def record(self, written: Iterable[Path]) -> list[str]:
        """Record each loop checkpoint among the files `written` (those of the folder named in the stage table)
        in loop_state.json; the names recorded (none outside a loop folder)."""
        if not self.active:
            return []
        files = [Path(p).resolve() for p in written]
        files = [p for p in files if p.parent == self.folder and p.name in RECORDED and p.is_file()]
        if not files:
            return []
        with updating_state(self.folder) as state:
            for path in files:
                state.checkpoints[path.name] = CheckpointRecord(
                    file=path.name, tool=self.tool, written_at=now(), sha256=sha256_of(path), inputs=self.inputs)
        return [p.name for p in files]
