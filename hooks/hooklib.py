"""Shared helpers of the plugin's hook scripts: read the payload, find the engine, answer, never fail.

Hooks run under the system `python3` with only the standard library. Whatever needs the engine
(pydantic models, the preflight) runs in a child process under the engine's interpreter: the plugin's own
environment (`$CLAUDE_PLUGIN_DATA/venv`, created by the MCP server's first `uv run`), else the current
interpreter when it can import the engine's dependencies. Every failure is swallowed: a hook must never
block the session because of itself (fail open).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PLUGIN_ROOT = Path(os.environ.get("CLAUDE_PLUGIN_ROOT") or Path(__file__).resolve().parent.parent)


def read_payload() -> dict[str, Any]:
    """The hook's stdin JSON, or {} when it is missing or malformed."""
    try:
        data = json.loads(sys.stdin.read() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return {}
    return data if isinstance(data, dict) else {}


def engine_python() -> str | None:
    """An interpreter that can import the engine, or None."""
    data = os.environ.get("CLAUDE_PLUGIN_DATA")
    if data:
        for name in ("bin/python", "Scripts/python.exe"):
            candidate = Path(data) / "venv" / name
            if candidate.is_file():
                return str(candidate)
    if all(importlib.util.find_spec(m) is not None for m in ("pydantic", "yaml", "jinja2")):
        return sys.executable
    return None


def project_python(project: str | None = None) -> str:
    """The interpreter that runs the user's workloads, chosen in the MCP server's order
    (`mcp_server/serve/interpreter.py`): $OPERATOR_PROFILER_PYTHON, else <project>/.venv/bin/python, else python3."""
    chosen = os.environ.get("OPERATOR_PROFILER_PYTHON")
    if chosen:
        return chosen
    venv = Path(os.environ.get("CLAUDE_PROJECT_DIR") or project or os.getcwd()) / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else shutil.which("python3") or "python3"


def run_engine(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    """`python -m <args>` in the plugin root under the engine's interpreter; None when it cannot run."""
    python = engine_python()
    if python is None:
        return None
    try:
        return subprocess.run([python, "-m", *args], cwd=PLUGIN_ROOT, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def emit(event: str, context: str = "", block_reason: str = "") -> None:
    """Print the hook's JSON answer: extra context for Claude, or (PostToolUse) a reason it must act on."""
    answer: dict[str, Any] = {}
    if block_reason:
        answer.update(decision="block", reason=block_reason)
    if context:
        answer["hookSpecificOutput"] = {"hookEventName": event, "additionalContext": context}
    if answer:
        print(json.dumps(answer))
