"""Set up `.venv` for Operator Profiler with the torch build this machine can use, then the package itself.

    python3 scripts/setup_env.py [--test] [--dry-run] [--venv PATH]

- A `.venv` whose torch already imports is kept as it is.
- A machine with an NVIDIA GPU (nvidia-smi lists one): when the python3 running this script already has a CUDA
  build of torch, the venv sees that interpreter's packages (a .pth file naming its site-packages; nothing is
  downloaded: GPU machines are often offline, so the package builds with that interpreter's setuptools);
  otherwise the CUDA build comes from PyPI (`pip install torch`).
- A machine without one: the CPU build, from PyTorch's CPU index (a plain `pip install torch` on Linux brings
  several GB of CUDA libraries); when that index cannot be reached, a CPU wheel (`torch-*+cpu-*.whl`) from
  pip's configured find-links folders.
- Then `pip install -e .[loop]` (pytest, which the loop's generated tests need; `[test]` for --test).
  Standard library only; argument lists, never a shell.
"""

from __future__ import annotations

import argparse
import configparser
import glob
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_PROBE = "import torch, sys; sys.stdout.write(str(torch.version.cuda))"


def has_nvidia_gpu() -> bool:
    """Whether nvidia-smi lists a GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


def torch_cuda(python: Path | str) -> str | None:
    """`torch.version.cuda` under `python` ("None" for a CPU build); None when torch does not import."""
    try:
        proc = subprocess.run([str(python), "-c", TORCH_PROBE], capture_output=True, text=True, timeout=300,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def local_cpu_wheels() -> list[str]:
    """CPU torch wheels in pip's configured find-links folders (newest last)."""
    folders: list[str] = os.environ.get("PIP_FIND_LINKS", "").split()
    for config in (Path("/etc/pip.conf"), Path.home() / ".config" / "pip" / "pip.conf", Path.home() / ".pip" /
                   "pip.conf", Path(os.environ.get("PIP_CONFIG_FILE", "/nonexistent"))):
        parser = configparser.ConfigParser()
        if config.is_file():
            parser.read(config)
            folders += parser.get("global", "find-links", fallback="").split()
    wheels = [w for folder in folders for w in glob.glob(os.path.join(folder.removeprefix("file://"),
                                                                        "torch-*+cpu-*.whl"))]
    return sorted(wheels)


BORROWED = "operator_profiler_system_torch.pth"  # names the site-packages a venv borrows torch from
SEE_PACKAGES = (
    f"import pathlib, site, sys; pathlib.Path(site.getsitepackages()[0], '{BORROWED}')"
    ".write_text(''.join(p + chr(10) for p in sys.argv[1:]))"
)


def site_packages() -> list[str]:
    """The site-packages folders of the interpreter running this script (where its torch lives)."""
    return [p for p in site.getsitepackages() if Path(p).is_dir()]


def plan(test: bool, venv: Path = VENV) -> list[list[str]]:
    """The commands that set up `venv` on this machine, in order."""
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    steps: list[list[str]] = []
    venv_torch = torch_cuda(venv / "bin" / "python") if (venv / "bin" / "python").is_file() else None
    borrowed = any(venv.glob(f"lib/python*/site-packages/{BORROWED}"))
    offline = ["--no-build-isolation"] if borrowed else []
    if venv_torch is None:
        gpu = has_nvidia_gpu()
        system_torch = torch_cuda(sys.executable)
        steps.append([sys.executable, "-m", "venv", str(venv)])
        if gpu and system_torch not in (None, "None"):
            steps.append([str(venv / "bin" / "python"), "-c", SEE_PACKAGES, *site_packages()])
            offline = ["--no-build-isolation"]  # builds with the interpreter's own setuptools: nothing to fetch
        elif gpu:
            steps.append([*pip, "torch"])
        else:
            steps.append([*pip, "torch", "--index-url", CPU_INDEX])
    steps.append([*pip, *offline, "-e", f"{REPO}[test]" if test else f"{REPO}[loop]"])
    return steps


def run(steps: list[list[str]], venv: Path = VENV) -> int:
    """Run the steps; a CPU index that cannot be reached falls back to a local CPU wheel. That attempt is quiet
    when a local wheel is there to fall back on (pip's errors are shown only if the fallback fails too), and
    retries once instead of pip's five times."""
    for step in steps:
        print("setup:", " ".join(step), flush=True)
        t0 = time.monotonic()
        code = _cpu_torch(step) if CPU_INDEX in step else subprocess.run(step, check=False).returncode
        if code != 0:
            print(f"setup: error: `{' '.join(step)}` failed (exit {code})", file=sys.stderr)
            return code
        print(f"setup: done in {time.monotonic() - t0:.0f} s", flush=True)
    cuda = torch_cuda(venv / "bin" / "python")
    print(f"setup: .venv ready; torch's CUDA: {cuda if cuda != 'None' else 'none (CPU build)'}", flush=True)
    return 0


def _cpu_torch(step: list[str]) -> int:
    """Install the CPU build of torch from the CPU index alone (another index configured for pip would offer the
    CUDA build beside it), else from a local CPU wheel."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    wheels = local_cpu_wheels()
    if not wheels:
        return _said(subprocess.run(step, check=False, env=env).returncode)
    proc = subprocess.run([*step, "--retries", "1"], check=False, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return 0
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("ERROR:")]
    print(f"setup: the CPU index is out of reach ({said[-1] if said else f'pip exited {proc.returncode}'}); "
          f"using {wheels[-1]}", flush=True)
    code = subprocess.run([*step[: step.index("torch")], wheels[-1]], check=False).returncode
    if code != 0:  # neither worked: what the index attempt said matters now
        sys.stderr.write(proc.stdout + proc.stderr)
    return _said(code)


def _said(code: int) -> int:
    if code != 0:
        print(f"setup: error: could not install a CPU build of torch from {CPU_INDEX} — reach that index, or put "
              "a torch-*+cpu wheel in a pip find-links folder", file=sys.stderr)
    return code


def main() -> int:
    """Plan the setup for this machine and run it (or print it with --dry-run)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test", action="store_true", help="also install the test tools (the test extra)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--venv", type=Path, default=VENV, help="the environment to set up (default: .venv)")
    args = parser.parse_args()
    steps = plan(args.test, args.venv.absolute())
    if args.dry_run:
        for step in steps:
            print(" ".join(step))
        return 0
    return run(steps, args.venv.absolute())


if __name__ == "__main__":
    sys.exit(main())
