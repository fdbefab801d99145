"""Typed errors, each carrying the remedy a user needs (printed as one line by the CLI)."""

from __future__ import annotations


class ProfilerError(Exception):
    """Base error: `message` says what went wrong, `remedy` what to do about it."""

    def __init__(self, message: str, remedy: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def one_line(self) -> str:
        """The error and its remedy on one line."""
        return f"{self.message} — {self.remedy}" if self.remedy else self.message


class WorkloadError(ProfilerError):
    """The workload file is missing, malformed, or raised while running."""


class UsageError(ProfilerError):
    """A command-line value is invalid."""


class ProfileFormatError(ProfilerError):
    """A profile.json (or another file the tool wrote) is corrupt or of another schema version."""


class BackendUnavailable(ProfilerError):
    """A requested profiler backend cannot run on this machine."""


class CaptureFailed(ProfilerError):
    """A profiler tool ran but produced no usable output."""


class CancelledCapture(ProfilerError):
    """The capture was cancelled (Ctrl-C or a cancelled request); its children were stopped."""
