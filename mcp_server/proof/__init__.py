"""Proof: is an optimized workload still right (validate), and how much faster (bench)?

Both run their work in a child (`mcp_server/children/bench.py`, `validate.py`) under the workload's own
interpreter; this package, on the engine's side, never imports torch. A child writes its result as JSON to the
path given with `--out`, whatever happens; the engine reads it and turns a child's error into a typed error
with a remedy.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

from mcp_server.errors import ChildTimedOut, UsageError, WorkloadError
from mcp_server.process import child_command, interpreter_env, run_child
from mcp_server.process.child import exit_description, log_tail
from mcp_server.progress import Progress, quiet


def check_python(python: str) -> str:
    """The interpreter to run children with: an existing file, or a name found on PATH."""
    if python.startswith("-"):
        raise UsageError(f"--python value {python!r} looks like an option", "pass the path of a Python interpreter")
    if Path(python).is_file():
        return python
    found = shutil.which(python)
    if found is None:
        raise UsageError(f"python interpreter not found: {python}", "pass --python PATH to an interpreter with torch")
    return found


def check_workload(path: Path, role: str = "") -> Path:
    """Resolve a workload file and check it follows the contract, naming the file that is wrong (`role`: which of
    two, "baseline" or "optimized"; none for a verb that takes one)."""
    path = Path(path)
    named = f"{role} workload" if role else "workload"
    if str(path).startswith("-"):
        raise UsageError(f"{named} {str(path)!r} looks like an option", "pass the path of a .py file")
    if path.is_dir():
        raise WorkloadError(f"{named} is a directory, not a .py file: {path}",
                            "pass the .py file in it that defines get_model_and_input()")
    if not path.is_file():
        raise WorkloadError(f"{named} not found: {path}", "pass the path of an existing .py file")
    if path.suffix != ".py":
        raise WorkloadError(f"{named} is not a .py file: {path}", "pass a Python file")
    if "get_model_and_input" not in path.read_text(encoding="utf-8", errors="replace"):
        raise WorkloadError(
            f"{named} {path} neither defines nor imports get_model_and_input(): recipes, bench and validate run the "
            "model it returns",
            "add `def get_model_and_input(): return model, inputs` (see docs/optimized-workload-contract.md); to "
            f"see where a script's time goes as it is, `operator-profiler run --script {path.name}`",
        )
    return path.resolve()


def run_proof_child(
    script: str,
    args: list[str],
    python: str,
    work_dir: Path,
    name: str,
    timeout_s: float,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    extra_env: dict[str, str] | None = None,
    keep_failed_log: Path | None = None,
) -> dict[str, Any]:
    """Run child `script` with `args --out WORK_DIR/<name>_child.json` under `python` (its environment with
    `extra_env` on top); return its JSON result. With `keep_failed_log`, a failed child's log is copied there (as
    `<name>.log`) and the error names the copy: WORK_DIR may then be a scratch folder.

    Setting `cancel` stops the child (CancelledCapture). Raises WorkloadError when the child timed out, wrote
    nothing, or reports that torch is missing or the baseline itself failed; a result with status 'ok' (a
    validation verdict included) is returned as is, with a warning for each process its workload left running
    outside its process group (stopped).
    """
    try:
        return _run_proof_child(script, args, python, work_dir, name, timeout_s, progress, cancel, extra_env)
    except WorkloadError as exc:
        log = work_dir / f"{name}_child.log"
        if keep_failed_log is not None and log.is_file():
            kept = keep_failed_log / f"{name}.log"
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log, kept)
            exc.message, exc.remedy = (text.replace(str(log), str(kept)) for text in (exc.message, exc.remedy))
            exc.args = (exc.message,)
        raise


def _run_proof_child(
    script: str, args: list[str], python: str, work_dir: Path, name: str, timeout_s: float, progress: Progress,
    cancel: threading.Event | None, extra_env: dict[str, str] | None,
) -> dict[str, Any]:
    work_dir.mkdir(parents=True, exist_ok=True)
    out = work_dir / f"{name}_child.json"
    log = work_dir / f"{name}_child.log"
    out.unlink(missing_ok=True)
    cmd = child_command(python, script, *args, "--out", str(out))
    strays: list[str] = []
    env = {**interpreter_env(python), **(extra_env or {})}
    code, timed_out = run_child(cmd, log, timeout_s, progress, cancel, env=env, stopped=strays)
    if timed_out:
        raise ChildTimedOut(
            f"the {name} child ran past its {timeout_s:.0f} s limit and was stopped",
            f"raise --timeout or shrink the workload; its output is in {log}",
        )
    if not out.is_file():
        tail = log_tail(log)
        raise WorkloadError(
            f"the {name} child {exit_description(code)} and wrote no result"
            + (f" (last lines: {tail})" if tail else ""),
            f"read {log}" if tail else f"nothing was printed: check that {python} is a Python interpreter",
        )
    try:
        result = json.loads(out.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"the {name} child wrote unreadable JSON to {out}: {exc}", f"read {log}") from exc
    if result.get("status") == "error":
        error = result.get("error", {})
        kind, message = error.get("kind"), error.get("message", "unknown error")
        if kind == "no_torch":
            raise WorkloadError(message, "pass --python PATH to an interpreter that has torch, or install torch there")
        lines = [ln.strip() for ln in str(error.get("traceback_tail", "")).strip().splitlines() if ln.strip()]
        where = f" (last lines: {' | '.join(lines[-3:])})" if lines else ""
        raise WorkloadError(
            f"{message}{where}",
            error.get("remedy") or f"fix the workload; the child's full output is in {log}",
        )
    result.setdefault("warnings", []).extend(
        f"the {name} child's workload left process {stray} running outside its process group (a session of its "
        "own): it was stopped" for stray in strays)
    return result
