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
    assert steps[2].endswith(f"install -q -e {REPO}[loop]")


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
    assert len(steps) == 1 and steps[0].endswith(f"install -q -e {REPO}[loop]")


def _wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal, valid wheel of package `name` (one module), written into `folder`."""
    import base64
    import hashlib
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def test_a_fallback_that_works_is_quiet(tmp_path: Path):
    """As on a machine whose pip finds torch's CPU wheel locally but reaches neither PyTorch's index nor its
    dependencies from that index alone: the first attempt fails on a dependency, the local wheel then installs
    with pip's own configuration, and nothing of the failed attempt is printed."""
    wheels, index = tmp_path / "wheels", tmp_path / "simple"  # the local wheel; pip's own index, for the dependency
    _wheel(wheels, "torch", "9.9.9+cpu", requires=("torchdep",))
    dep = _wheel(index / "torchdep", "torchdep", "1.0")
    (index / "torchdep" / "index.html").write_text(f'<a href="{dep.name}">{dep.name}</a>\n')
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nindex-url = file://{index}\n")
    target = tmp_path / "site"
    script = (f"import sys; sys.path.insert(0, {str(SETUP.parent)!r}); import setup_env as s; "
              f"sys.exit(s.run([[sys.executable, '-m', 'pip', 'install', '-q', '--target', {str(target)!r}, "
              f"'torch', '--index-url', s.CPU_INDEX]], venv=__import__('pathlib').Path({str(tmp_path / 'no')!r})))")
    env = {**os.environ, "PIP_FIND_LINKS": str(wheels), "PIP_CONFIG_FILE": str(config),
           "https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "PIP_TIMEOUT": "5"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert (target / "torch" / "__init__.py").is_file() and (target / "torchdep").is_dir()
    assert "the CPU index is out of reach" in said and "using " + str(wheels / "torch-9.9.9+cpu-py3-none-any.whl")
    assert "ERROR" not in said.replace("(ERROR:", ""), said  # pip's error is named once, in the fallback's line
    assert "Retrying" not in said and "Traceback" not in said
