"""Shared test set-up: shrunken examples for CPU runs, the repository root."""

from __future__ import annotations

import os
from pathlib import Path

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
