"""The environment of a child that runs the workload's interpreter, with a bytecode cache where it has none.

Every pass of a run starts a fresh interpreter that imports torch, Dynamo and Inductor. An environment that
forbids writing bytecode (`PYTHONDONTWRITEBYTECODE`, common in container images) and ships none makes each of
them compile those sources again: on the H100 machine's image, `import torch` took 4 s and Dynamo's import
another 5 to 7 s in every pass, most of it compiling. Such children get a bytecode cache of their own
(`PYTHONPYCACHEPREFIX`, outside the user's tree), so the sources compile once across passes and runs.
`OPERATOR_PROFILER_BYTECODE_CACHE=off` keeps the environment exactly as it is.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

OPT_OUT = "OPERATOR_PROFILER_BYTECODE_CACHE"
# Whether torch's own __init__ has bytecode beside its source: found without importing torch.
_PROBE = (
    "import importlib.util as u, os; s = u.find_spec('torch'); "
    "print(bool(s and s.origin and os.path.exists(u.cache_from_source(s.origin))))"
)


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the bytecode cache lives: $XDG_CACHE_HOME/operator-profiler/pycache (~/.cache by default)."""
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "operator-profiler" / "pycache"


@functools.lru_cache(maxsize=8)
def torch_bytecode_cached(python: str) -> bool:
    """Whether `python` finds torch with its bytecode already written beside the source (True when unknown)."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return proc.stdout.strip() != "False"


def uses_cache(python: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether children running `python` get the bytecode cache: writing bytecode is forbidden, no prefix is
    set, torch has none compiled, and the user did not opt out."""
    return (
        bool(environ.get("PYTHONDONTWRITEBYTECODE"))
        and not environ.get("PYTHONPYCACHEPREFIX")
        and environ.get(OPT_OUT, "").lower() != "off"
        and not torch_bytecode_cached(python)
    )


def interpreter_env(python: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment for a child running `python`: unbuffered output, and the bytecode cache when it applies."""
    env = {**environ, "PYTHONUNBUFFERED": "1"}
    if uses_cache(python, environ):
        env.pop("PYTHONDONTWRITEBYTECODE")
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir(environ))
    return env
