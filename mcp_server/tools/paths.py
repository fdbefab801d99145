"""Paths the tools accept and write: resolved against the client's project, one fresh directory per run."""

from __future__ import annotations

import os
from pathlib import Path

from mcp_server.errors import ProfileFormatError, UsageError, WorkloadError
from mcp_server.pipeline.rundir import MANIFEST, PROFILE, default_run_dir

PROJECT_ENV = "CLAUDE_PROJECT_DIR"
RESERVE_ATTEMPTS = 50


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


def workload_file(value: str, role: str = "workload") -> Path:
    """An existing .py workload file, or a WorkloadError that says where relative paths were looked up."""
    path = resolve(value, f"{role} file")
    if not path.is_file():
        raise WorkloadError(
            f"{role} not found: {path}",
            f"pass an existing .py file; relative paths resolve against {project_dir()} "
            f"({PROJECT_ENV} when set, else the server's working directory)",
        )
    return path


def profile_file(value: str) -> Path:
    """A profile.json, given either its path or the run directory holding it."""
    path = resolve(value, "profile")
    if path.is_dir():
        if not (path / PROFILE).is_file():
            raise ProfileFormatError(
                f"{path} holds no {PROFILE}",
                "run `assemble` on it if it is a run directory, or pass the profile.json a `profile` call returned",
            )
        return path / PROFILE
    if not path.is_file():
        raise ProfileFormatError(
            f"profile not found: {path}", f"pass a profile.json or run directory; relative paths resolve against "
            f"{project_dir()}",
        )
    return path


def run_directory(value: str) -> Path:
    """An existing run directory (one holding manifest.json)."""
    path = resolve(value, "run directory")
    if path.is_file() and path.name in (PROFILE, MANIFEST):
        path = path.parent
    if not (path / MANIFEST).is_file():
        raise ProfileFormatError(
            f"{path} is not a run directory (no {MANIFEST})", "pass the run_dir a `profile` call returned"
        )
    return path


def fresh_dir(name_from: Path, suffix: str | None = None) -> Path:
    """Create and return `<project>/op_runs/<name>[-suffix]-<time>[-N]`, never a directory another call holds.

    default_run_dir picks a name nobody has yet; creating it with exist_ok=False claims it, so two calls in
    the same second get two directories.
    """
    for _ in range(RESERVE_ATTEMPTS):
        candidate = default_run_dir(name_from, root=project_dir(), suffix=suffix)
        try:
            candidate.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(
                f"cannot create {candidate}: {exc.strerror or exc}", "pass output= a directory you can write to"
            ) from exc
        return candidate
    raise UsageError(f"could not claim a fresh directory under {project_dir() / 'op_runs'}", "pass output= explicitly")


def output_dir(value: str | None, name_from: Path, suffix: str | None = None) -> Path:
    """The caller's output directory (created), or a fresh one under <project>/op_runs."""
    if value is None:
        return fresh_dir(name_from, suffix)
    path = resolve(value, "output directory")
    if path.exists() and not path.is_dir():
        raise UsageError(f"output path exists and is not a directory: {path}", "pass output= a directory path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror or exc}", "pass output= a directory you can write to") \
            from exc
    return path


def files_under(folder: Path) -> list[str]:
    """Every regular file below `folder`, as sorted absolute paths (what a tool wrote there)."""
    return sorted(str(p) for p in Path(folder).rglob("*") if p.is_file() and not p.name.startswith(".write-test"))
