"""A user's non-editable install (`pip install .`, a wheel) in an environment without torch assembles a recorded GPU
run, analyses it and renders its report: the knowledge tables and templates ship with the package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import FIXTURES

PIP_TIMEOUT_S = 900
SKIPPED = (".git", ".venv", ".ci", ".devkit", "build", "*.egg-info", "op_runs", "node_modules", "__pycache__",
           ".mypy_cache", ".ruff_cache", ".pytest_cache", "fixtures")


@pytest.mark.slow
def test_a_wheel_install_without_torch_assembles_analyses_and_reports(tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, cli = venv / "bin" / "python", venv / "bin" / "operator-profiler"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # built from a copy: the checkout stays as it is
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*SKIPPED))
    built = subprocess.run([str(python), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(wheels.glob("operator_profiler-*.whl"))
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True,
                               text=True, timeout=PIP_TIMEOUT_S, env=env, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    no_torch = subprocess.run([str(python), "-c", "import torch"], cwd=work, capture_output=True, env=env,
                              check=False)
    assert no_torch.returncode != 0, "the environment must not have torch"
    with tarfile.open(FIXTURES / "h200_conv_block_inductor.tar.xz", "r:xz") as tar:
        tar.extractall(work, filter="data")
    run = work / "conv_block_inductor"

    def cli_ok(*args: str) -> str:
        proc = subprocess.run([str(cli), *args], cwd=work, capture_output=True, text=True, timeout=600, env=env,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    located = subprocess.run([str(python), "-c", "import mcp_server; print(mcp_server.__file__)"], cwd=work,
                             capture_output=True, text=True, env=env, check=True).stdout
    assert str(venv) in located, "the installed package runs, not the checkout"
    assert f"profile: {run / 'profile.json'}" in cli_ok("assemble", str(run))
    printed = cli_ok("analyze", str(run / "profile.json"), "-o", str(work / "analysis"))
    assert f"analysis: {work / 'analysis' / 'analysis.json'}" in printed
    assert (work / "analysis" / "roofline.png").is_file()
    cli_ok("report", str(run / "profile.json"), "--analysis", str(work / "analysis" / "analysis.json"),
           "-o", str(work / "report"))
    report = (work / "report" / "report.md").read_text(encoding="utf-8")
    assert "conv_block" in report and "H200" in report
