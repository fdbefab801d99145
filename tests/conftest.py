"""Shared test set-up: shrunken examples for CPU runs, the repository root."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PATTERNS = REPO / "knowledge" / "fx_patterns"
EXAMPLE_NAMES = sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir())

os.environ.setdefault("OPERATOR_PROFILER_EXAMPLE_SCALE", "small")

# Generated tests of optimized workloads are run by `validate` (tests/test_validate.py), not collected here.
collect_ignore_glob = ["workloads/test_*.py"]


@pytest.fixture()
def example():
    """Path of an example workload by name."""
    return lambda name: EXAMPLES / name / f"{name}.py"


def own_workload_at_small_scale(check: str) -> Any:
    """The JSON the Python source `check` prints last, run in a child as a user's process would: scripts/gpu_workloads/
    its folder, the small scale."""
    env = {**os.environ, "OPERATOR_PROFILER_EXAMPLE_SCALE": "small"}
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO / "scripts" / "gpu_workloads", env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def under_triton_interpreter(pattern: str, body: str) -> Any:
    """The JSON `body` prints last, run in a fresh process under Triton's interpreter (TRITON_INTERPRET=1: a kernel
    runs on CPU tensors) with knowledge/fx_patterns/<pattern>.py imported as `op`, and `torch` and `json` too."""
    check = (f"import importlib.util, json, torch\n"
             f"spec = importlib.util.spec_from_file_location('op', {str(PATTERNS / f'{pattern}.py')!r})\n"
             "op = importlib.util.module_from_spec(spec); spec.loader.exec_module(op)\n" + body)
    done = subprocess.run([sys.executable, "-c", check], env={**os.environ, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def load_pattern(name: str) -> ModuleType:
    """knowledge/fx_patterns/<name>.py imported as module `fx_pattern_<name>` (once: a second call returns it)."""
    key = f"fx_pattern_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, PATTERNS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
