"""The README's setup picks the torch build the machine can use: the CPU build from PyTorch's CPU index where
no NVIDIA GPU is listed, the CUDA build (or the system's own) where one is. nvidia-smi is the boundary: a script
standing in for it lists a GPU, or fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SETUP = REPO / "scripts" / "setup_env.py"


def _plan(tmp_path: Path, gpu: bool) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n" if gpu else "#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(SETUP), "--dry-run", "--venv", str(tmp_path / "venv")],
                          capture_output=True, text=True, env=env, timeout=300, check=True)
    return proc.stdout.splitlines()


def test_without_a_gpu_torch_comes_from_the_cpu_index(tmp_path: Path):
    steps = _plan(tmp_path, gpu=False)
    assert steps[0].endswith(f"-m venv {tmp_path / 'venv'}")
    assert steps[1].endswith("install -q torch --index-url https://download.pytorch.org/whl/cpu")
    assert steps[2].endswith(f"install -q -e {REPO}")


def test_with_a_gpu_torch_is_the_cuda_build(tmp_path: Path):
    steps = _plan(tmp_path, gpu=True)
    # This interpreter's torch is a CPU build, so the venv does not borrow it: the CUDA build comes from PyPI.
    assert steps[1].endswith("install -q torch") and "--index-url" not in steps[1]


def test_a_venv_whose_torch_imports_is_kept(tmp_path: Path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this interpreter: torch imports
    (venv / "python").chmod(0o755)
    steps = _plan(tmp_path, gpu=False)
    assert len(steps) == 1 and steps[0].endswith(f"install -q -e {REPO}")
