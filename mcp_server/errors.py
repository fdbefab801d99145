"""Typed errors, each carrying the remedy a user needs (printed as one line by the CLI)."""

from __future__ import annotations

import errno


class ProfilerError(Exception):
    """Base error: `message` says what went wrong, `remedy` what to do about it."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        self.records: list[object] = []  # capture passes that ran before the failure: the manifest keeps them
        self.details: list[str] = []  # lines the faces show below the one-line error (an out-of-memory diagnosis)

    def one_line(self) -> str:
        """The error and its remedy on one line."""
        return f"{self.message} — {self.remedy}" if self.remedy else self.message


class WorkloadError(ProfilerError):
    """The workload file is missing, malformed, or raised while running."""


class ChildTimedOut(WorkloadError):
    """A child process ran past its time limit and was stopped."""


class WorkloadOutOfMemory(WorkloadError):
    """The workload raised torch.OutOfMemoryError; `details` say what held the memory once it was diagnosed."""


class UsageError(ProfilerError):
    """A command-line value is invalid."""


class ScriptSpawnsRanks(UsageError):
    """A script run as one process starts `ranks` processes with torch.multiprocessing.spawn: its ranks are to be
    launched through torchrun (`profile` and `run` do so themselves)."""

    def __init__(self, ranks: int, message: str) -> None:
        super().__init__(message, f"pass --nproc-per-node {ranks}: each spawned process is profiled as a torchrun rank")
        self.ranks = ranks


class ProfileFormatError(ProfilerError):
    """A profile.json (or another file the tool wrote) is corrupt or of another schema version."""


class BackendUnavailable(ProfilerError):
    """A requested profiler backend cannot run on this machine."""


class CaptureFailed(ProfilerError):
    """A profiler tool ran but produced no usable output."""


class CancelledCapture(ProfilerError):
    """The capture was cancelled (Ctrl-C or a cancelled request); its children were stopped."""


def from_os_error(exc: OSError, limit: int = 200) -> ProfilerError:
    """An operating-system error the engine met on a path (permissions, a name too long, a full disk) as a
    one-line error with a remedy: the faces' last word on what escaped the typed errors."""
    name = str(exc.filename) if exc.filename is not None else ""
    shown = name if len(name) <= limit else f"{name[:limit]}… ({len(name)} characters)"
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return UsageError(f"{exc.strerror or exc}" + (f": {shown}" if shown else ""),
                      "free space on that disk, or write elsewhere (--output)" if full else
                      "check the path, its permissions and the free space")
