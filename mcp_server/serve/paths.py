"""The paths the MCP tools accept: resolved against the client's project directory, and confined to the folders the
server may read and write (as the reference MCP servers confine theirs): the project directory, the roots the client
declared, and the folders $OPERATOR_PROFILER_ALLOWED_DIRS adds (`/` allows everything). The workload's interpreter
is run, not read: it may live anywhere.
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path

from mcp_server.errors import UsageError, WorkloadError

PROJECT_ENV = "CLAUDE_PROJECT_DIR"
ALLOWED_ENV = "OPERATOR_PROFILER_ALLOWED_DIRS"
# The roots the client of the call being served declared (file:// URIs as paths), set by the tool before its work.
CLIENT_ROOTS: ContextVar[tuple[Path, ...]] = ContextVar("client_roots", default=())


def allowed_dirs() -> list[Path]:
    """The folders a tool may read and write: the project directory, the client's roots, $OPERATOR_PROFILER_ALLOWED_DIRS
    (folders separated by os.pathsep), each with its symbolic links resolved."""
    extra = [Path(p).expanduser() for p in os.environ.get(ALLOWED_ENV, "").split(os.pathsep) if p.strip()]
    found = [project_dir(), *CLIENT_ROOTS.get(), *extra]
    return list(dict.fromkeys(Path(os.path.realpath(p)) for p in found))


def confined(path: Path, what: str) -> Path:
    """`path` when it lies inside a folder of `allowed_dirs` (its links resolved), else a UsageError that names
    the folders and how to widen them."""
    real = Path(os.path.realpath(path))
    dirs = allowed_dirs()
    if any(real == d or d in real.parents for d in dirs):
        return path
    raise UsageError(
        f"{what} {path} is outside the folders this server may read and write ({', '.join(map(str, dirs))})",
        f"pass a path inside them, or add its folder to {ALLOWED_ENV} in the server's environment (folders "
        f"separated by '{os.pathsep}'; '/' allows every path)",
    )


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
    """An absolute path for a user value inside the allowed folders: relative values resolve against the project
    directory."""
    if not value or not value.strip():
        raise UsageError(f"no {what} given", f"pass the path of the {what}")
    if value.startswith("-"):
        raise UsageError(f"{what} {value!r} looks like an option", f"pass the path of the {what}")
    path = Path(value).expanduser()
    return confined(path if path.is_absolute() else project_dir() / path, what)


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
