"""The paths the MCP tools accept: resolved against the client's project directory."""

from __future__ import annotations

import os
from pathlib import Path

from mcp_server.errors import UsageError, WorkloadError

PROJECT_ENV = "CLAUDE_PROJECT_DIR"


def project_dir() -> Path:
    """The client's working directory: CLAUDE_PROJECT_DIR when set, else the server's current directory."""
    value = os.environ.get(PROJECT_ENV)
    if value:
        path = Path(value).expanduser()
        if not path.is_dir():
            raise UsageError(f"{PROJECT_ENV}={value} is not a directory", f"set {PROJECT_ENV} to the project's folder")
        return path.absolute()
    return Path.cwd()


def resolve(value: str, what: str) -> Path:
    """An absolute path for a user value: relative values resolve against the project directory."""
    if not value or not value.strip():
        raise UsageError(f"no {what} given", f"pass the path of the {what}")
    if value.startswith("-"):
        raise UsageError(f"{what} {value!r} looks like an option", f"pass the path of the {what}")
    path = Path(value).expanduser()
    return path if path.is_absolute() else project_dir() / path


def resolve_optional(value: str | None, what: str) -> Path | None:
    """`resolve`, or None for no value."""
    return None if value is None else resolve(value, what)


def workload_file(value: str, role: str = "workload") -> Path:
    """An existing workload file, or a WorkloadError that says where relative paths were looked up."""
    path = resolve(value, f"{role} file")
    if path.is_dir():
        raise WorkloadError(f"{role} is a directory, not a .py file: {path}",
                            "pass the .py file in it that defines get_model_and_input()")
    if not path.is_file():
        raise WorkloadError(
            f"{role} not found: {path}",
            f"pass an existing .py file; relative paths resolve against {project_dir()} "
            f"({PROJECT_ENV} when set, else the server's working directory)",
        )
    return path
