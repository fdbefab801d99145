"""PostToolUse hook: nudge the loop forward when profile.json, optimizations.json or *_optimized.py is written.

Reads the hook's stdin JSON, finds the watched files the tool wrote (Write/Edit file paths, paths in an
Operator Profiler MCP tool's result, paths in a Bash command), and answers with the next step, or with a
reason Claude must act on (an invalid optimizations.json, an optimized workload that breaks the contract).
Fails open: any error exits 0 without output.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hooklib import emit, read_payload  # noqa: E402
from nudges import NUDGES, kind_of  # noqa: E402

MCP_PREFIX = "mcp__plugin_operator-profiler_operator-profiler__"
# The server's read-only tools (annotated read_only_hint): their results name files they did not write.
WRITES_NOTHING = frozenset({"preflight", "top_operators", "operator_detail", "kernel_detail", "loop_status"})
COPY_COMMANDS = ("cp", "mv", "install")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def written_paths(payload: dict[str, Any]) -> list[Path]:
    """Existing files of interest the tool call wrote, resolved against the session's directory."""
    tool, tool_input = payload.get("tool_name", ""), payload.get("tool_input") or {}
    if tool.startswith(MCP_PREFIX):
        candidates = [] if tool[len(MCP_PREFIX):] in WRITES_NOTHING else _strings(payload.get("tool_response"))
    elif tool == "Bash":
        try:
            words = shlex.split(str(tool_input.get("command", "")))
        except ValueError:
            words = []
        candidates = words[-1:] if words and words[0] in COPY_COMMANDS else []  # the destination of cp/mv
    else:
        candidates = [str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")]
    cwd = Path(payload.get("cwd") or ".")
    found = []
    for text in candidates:
        path = cwd / text.strip() if text.strip() else None
        if path is not None and kind_of(path) and path.is_file() and path not in found:
            found.append(path)
    return found


def main() -> int:
    """Answer with the context and block reasons of every watched file written."""
    contexts, reasons = [], []
    for path in written_paths(read_payload()):
        context, reason = NUDGES[kind_of(path)](path)
        contexts += [context] if context else []
        reasons += [reason] if reason else []
    emit("PostToolUse", "\n".join(contexts), "\n".join(reasons))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - a hook fails open
        sys.exit(0)
