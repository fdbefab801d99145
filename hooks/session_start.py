"""SessionStart hook: a quick preflight (seconds) so the session knows which profiling backend will work.

Runs `operator-profiler preflight --quick` under the engine's interpreter, for the interpreter the workloads will
run under (the MCP server's choice), and hands its lines to Claude as context; says when `uv`, which starts the
plugin's MCP server, is missing. Fails open: no engine yet, a timeout or any error prints a one-line note or
nothing, exit 0.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hooklib import emit, project_python, read_payload, run_engine  # noqa: E402

TIMEOUT_S = 10.0
MAX_LINES = 12
NO_UV = ("Operator Profiler: `uv` is not on PATH, and the plugin's MCP server is started with it (its tools will be "
         "missing): install it (`curl -LsSf https://astral.sh/uv/install.sh | sh`, or `pip install uv`) and restart "
         "Claude Code, or register the server yourself (README: Claude Code plugin).")


def main() -> int:
    """Emit the quick preflight as session context."""
    payload = read_payload()
    if payload.get("source") == "compact":
        return 0  # the context from the session's start is still there
    uv = [] if shutil.which("uv") else [NO_UV]
    python = project_python(payload.get("cwd"))
    proc = run_engine(["mcp_server.cli", "preflight", "--quick", "--python", python], TIMEOUT_S)
    if proc is None:
        emit("SessionStart", "\n".join(["Operator Profiler: the engine's environment is not ready yet (the MCP "
                                        "server installs it on first start); run the preflight skill when "
                                        "profiling.", *uv]))
        return 0
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()][:MAX_LINES]
    if not lines:
        return 0
    verdict = "all checks passed" if proc.returncode == 0 else "some checks failed (remedies below)"
    emit("SessionStart", f"Operator Profiler quick preflight: {verdict}.\n" + "\n".join([*lines, *uv]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - a hook fails open
        sys.exit(0)
