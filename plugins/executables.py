"""Finding external profiler executables and running them: argument lists only, never a shell string."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ToolInfo:
    """A located executable and the version it reported."""

    name: str
    path: str
    version: str | None


def find_executable(name: str, env_var: str, globs: list[str]) -> str | None:
    """Locate `name`: the `env_var` override, then PATH, then well-known install folders (newest first)."""
    override = os.environ.get(env_var)
    if override:
        return override if Path(override).is_file() and os.access(override, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    for pattern in globs:
        for candidate in sorted(glob.glob(pattern), reverse=True):
            if os.access(candidate, os.X_OK) and Path(candidate).is_file():
                return candidate
    return None


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible here (nvidia-smi is on PATH): the timing pass and nsys need one."""
    return shutil.which("nvidia-smi") is not None


def tool_version(path: str, timeout_s: float = 30.0) -> str | None:
    """First line of `<tool> --version` that names a version, or None if it does not run."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    for line in lines:
        if "version" in line.lower() or line[:1].isdigit():
            return line
    return lines[0] if lines else None


def query_gpu(timeout_s: float = 20.0) -> dict[str, str]:
    """nvidia-smi's view of GPU 0 (name, driver, current clocks) and how many GPUs it lists (`count`); empty when
    nvidia-smi is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    fields = ["name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem"]
    try:
        proc = subprocess.run(
            [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {}
    values = [v.strip() for v in lines[0].split(",")]
    keys = ["name", "driver_version", "clocks_sm_mhz", "clocks_mem_mhz", "clocks_max_sm_mhz", "clocks_max_mem_mhz"]
    found = {k: v for k, v in zip(keys, values, strict=False) if v and v != "[N/A]"}
    return {**found, "count": str(len(lines))}


@functools.cache
def gpu_name() -> str | None:
    """GPU 0's name as nvidia-smi gives it (asked once per process); None without nvidia-smi."""
    return query_gpu().get("name")
