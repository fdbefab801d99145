"""Which Python runs the workload: the user's, never the server's (the server may have no torch at all)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from mcp_server.errors import UsageError
from mcp_server.schema.requests import Interpreter
from mcp_server.serve.paths import project_dir

PYTHON_ENV = "OPERATOR_PROFILER_PYTHON"
VENV_PYTHON = Path(".venv") / "bin" / "python"


def _usable(value: str, origin: str) -> str:
    """An interpreter path from a user value: a path (relative to the project) or a name on PATH."""
    if value.startswith("-"):
        raise UsageError(f"{origin} {value!r} looks like an option", "pass the path of a Python interpreter")
    if os.sep in value or "/" in value:
        path = Path(value).expanduser()
        path = path if path.is_absolute() else project_dir() / path
        if not path.is_file():
            raise UsageError(f"python interpreter not found: {path} (from {origin})",
                             f"pass python= or set {PYTHON_ENV} to an interpreter that has torch")
        return str(path)
    found = shutil.which(value)
    if found is None:
        raise UsageError(f"python interpreter {value!r} (from {origin}) is not on PATH",
                         f"pass python= or set {PYTHON_ENV} to the full path of an interpreter that has torch")
    return found


def choose_python(python: str | None = None) -> Interpreter:
    """The `python` argument, else $OPERATOR_PROFILER_PYTHON, else <project>/.venv/bin/python, else python3."""
    if python:
        return Interpreter(python=_usable(python, "the python argument"), source="argument")
    env = os.environ.get(PYTHON_ENV)
    if env:
        return Interpreter(python=_usable(env, PYTHON_ENV), source=PYTHON_ENV)
    venv = project_dir() / VENV_PYTHON
    if venv.is_file():
        return Interpreter(python=str(venv), source="project .venv")
    found = shutil.which("python3")
    if found is None:
        raise UsageError("no python3 on PATH and no project .venv",
                         f"pass python= or set {PYTHON_ENV} to an interpreter that has torch")
    return Interpreter(python=found, source="PATH")
