"""Where the child scripts live and how a command runs one under the workload's interpreter.

The scripts in `mcp_server/children/` need only the standard library and torch; the engine never imports
them, it runs them as files (`python <children>/<script>.py ...`).
"""

from __future__ import annotations

from pathlib import Path

CHILDREN_DIR = Path(__file__).resolve().parents[1] / "children"


def child_script(name: str) -> Path:
    """The path of child script `name` (harness, bench, validate, microbench)."""
    return CHILDREN_DIR / f"{name}.py"


def child_command(python: str, name: str, *args: str) -> list[str]:
    """The argument list running child script `name` under `python`."""
    return [python, str(child_script(name)), *args]
