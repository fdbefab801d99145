"""The code base stays ruff-clean and type-checks (mypy, configured in pyproject.toml)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize("tool, args", [("ruff", ["check", "--no-cache", "."]), ("mypy", [])])
def test_code_is_clean(tool: str, args: list[str]):
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is missing: install the test extra (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
