"""Shared test set-up: shrunken examples for CPU runs, the repository root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
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
