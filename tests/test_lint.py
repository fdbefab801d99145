"""The code base stays ruff-clean."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from conftest import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the test extra")
def test_ruff_clean():
    proc = subprocess.run(["ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
