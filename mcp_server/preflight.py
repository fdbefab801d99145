"""Preflight: can this machine profile? GPU, driver, torch/CUDA, nsys, ncu, counter permission.

Each check is either needed by the backend `profile --backend auto` chooses here (a failure is a FAIL, and
preflight fails) or needed only for the GPU path (nsys timeline and ncu counters), which is information on a
machine where the torch.profiler backend is what runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

from mcp_server.backends.registry import REGISTRY
from mcp_server.process.bytecode import (
    MIN_WORKERS,
    OPT_OUT,
    RESERVED_CPUS,
    WORKERS_ENV,
    asked_workers,
    cache_bytes,
    cache_dir,
    interpreter_env,
    precompile_workers,
    uses_cache,
)
from mcp_server.schema.results import PreflightCheck
from plugins.executables import query_gpu

_TORCH_PROBE = (
    "import json, torch; c = torch.cuda.is_available(); "
    "print(json.dumps({'torch': torch.__version__, 'cuda_build': torch.version.cuda, 'cuda_available': c, "
    "'device': torch.cuda.get_device_name(0) if c else None}))"
)
# Where torch is, without importing it (seconds): what a quick preflight asks the interpreter.
_FIND_TORCH = "import importlib.util as u; s = u.find_spec('torch'); print(s.origin if s and s.origin else '')"
PROFILING_PARAMS = Path("/proc/driver/nvidia/params")
INTERPRETER_CHECKS = ("torch", "bytecode")  # every backend needs the workload's interpreter with torch


class PreflightReport(BaseModel):
    """All checks, and the backend a `profile --backend auto` would use."""

    checks: list[PreflightCheck] = Field(default_factory=list)
    backend: str
    python: str

    @property
    def ok(self) -> bool:
        """True when every check the chosen backend needs passed."""
        return all(c.ok for c in self.checks if c.required)


def _torch_check(python: str, timeout_s: float) -> tuple[PreflightCheck, bool]:
    try:
        proc = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, timeout=timeout_s,
                              check=False, env=interpreter_env(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PreflightCheck(name="torch", ok=False, detail=f"{python} did not run: {exc}",
                     remedy="pass --python PATH to the interpreter of your project"), False
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return PreflightCheck(name="torch", ok=False, detail=f"{python} cannot import torch: {last}",
                     remedy="install torch in that environment, or pass --python PATH"), False
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    cuda = bool(info["cuda_available"])
    detail = f"torch {info['torch']} (CUDA build {info['cuda_build'] or 'none'}); " + (
        f"CUDA available on {info['device']}" if cuda else "CUDA not available: CPU operator times only"
    )
    return PreflightCheck(name="torch", ok=True, detail=detail), cuda


def _torch_found(python: str, timeout_s: float) -> PreflightCheck:
    """The quick check: whether `python` finds torch, without importing it (a fraction of a second)."""
    try:
        proc = subprocess.run([python, "-c", _FIND_TORCH], capture_output=True, text=True, timeout=timeout_s,
                              check=False, env=interpreter_env(python))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PreflightCheck(name="torch", ok=False, detail=f"{python} did not run: {exc}",
                              remedy="pass --python PATH to the interpreter of your project")
    origin = proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else ""
    if not origin:
        said = (proc.stderr.strip() or "no output")[-200:]
        why = "finds no torch" if proc.returncode == 0 else f"did not run ({said})"
        return PreflightCheck(name="torch", ok=False, detail=f"{python} {why} (quick check: torch not imported)",
                              remedy="install torch in that environment, or pass --python PATH")
    return PreflightCheck(name="torch", ok=True, detail=f"found at {Path(origin).parent} (quick check: not imported, "
                          "so its version and CUDA are not known)")


def _bytecode_check(python: str) -> PreflightCheck | None:
    """Said only when passes get a bytecode cache (nothing is wrong either way)."""
    if not uses_cache(python):
        return None
    workers = precompile_workers()
    why_not = f"{WORKERS_ENV} is 0" if asked_workers() is not None else f"fewer than {RESERVED_CPUS + MIN_WORKERS} CPUs"
    first = (f"the first run compiles it there in {workers} workers beside the passes ({WORKERS_ENV}=0: no)"
             if workers else f"{why_not}: the passes compile it themselves")
    held = cache_bytes(cache_dir())
    size = (f"it holds {held / 2**20:.0f} MiB now (a run that compiles removes the bytecode of sources no longer "
            "installed)" if held else "it is empty now")
    return PreflightCheck(
        name="bytecode", ok=True,
        detail=f"PYTHONDONTWRITEBYTECODE is set and torch has no compiled bytecode: passes compile it once into "
        f"{cache_dir()}; {size}; {first} ({OPT_OUT}=off to keep the environment as it is)",
    )


def _counter_permission() -> PreflightCheck:
    if os.geteuid() == 0:
        return PreflightCheck(name="counter permission", ok=True, detail="running as root")
    if PROFILING_PARAMS.is_file():
        text = PROFILING_PARAMS.read_text(errors="replace")
        if "RmProfilingAdminOnly: 1" in text:
            return PreflightCheck(
                name="counter permission", ok=False,
                detail="the driver restricts GPU performance counters to admin users (ERR_NVGPUCTRPERM)",
                remedy="run as root, use --ncu-sudo, or set `options nvidia NVreg_RestrictProfilingToAdminUsers=0`",
            )
        return PreflightCheck(name="counter permission", ok=True, detail="the driver lets all users read counters")
    return PreflightCheck(name="counter permission", ok=True,
                          detail="unknown (no /proc/driver/nvidia/params); ncu will tell")


def preflight(python: str, quick: bool = False, timeout_s: float = 60.0) -> PreflightReport:
    """Run every check; `quick` only asks the workload's interpreter where torch is (without importing it) and
    skips the tools' version queries."""
    checks: list[PreflightCheck] = []
    gpu = query_gpu()
    checks.append(
        PreflightCheck(name="gpu", ok=True, detail=f"{gpu['name']}, driver {gpu.get('driver_version', '?')}, "
                       f"SM clock {gpu.get('clocks_sm_mhz', '?')} MHz")
        if gpu else
        PreflightCheck(name="gpu", ok=False, detail="no NVIDIA GPU visible (nvidia-smi missing or failing)",
                       remedy="run on a machine with an NVIDIA GPU and its driver")
    )
    cuda = False
    if quick:
        checks.append(_torch_found(python, timeout_s))
    else:
        torch_check, cuda = _torch_check(python, timeout_s)
        checks.append(torch_check)
        if gpu and torch_check.ok and not cuda:
            checks.append(PreflightCheck(name="torch CUDA", ok=False, detail="a GPU is visible but this torch has no "
                                         "CUDA", remedy="install a CUDA build of torch in that environment"))
        bytecode = _bytecode_check(python)
        if bytecode is not None:
            checks.append(bytecode)
    for candidate in REGISTRY.values():
        checks += candidate.tool_checks(quick)
    if gpu:
        checks.append(_counter_permission())
    facts = {c.name: c.ok for c in checks} | {"cuda": cuda or quick}
    backend = next(b for b in REGISTRY.values() if all(facts.get(need, True) for need in b.preflight_needs))
    for check in checks:  # what the chosen backend does not use is information
        check.required = check.name in INTERPRETER_CHECKS or check.name in backend.required_checks
    return PreflightReport(checks=checks, backend=backend.name, python=python)


def format_report(report: PreflightReport) -> str:
    """One line per check, with its remedy: FAIL for what the chosen backend needs, info for the GPU path."""
    lines = []
    for check in report.checks:
        mark = "ok  " if check.ok else ("FAIL" if check.required else "info")
        lines.append(f"[{mark}] {check.name:18s} {check.detail}")
        if check.remedy and not check.ok:
            what = "remedy" if check.required else "for the GPU path (nsys timeline, ncu counters)"
            lines.append(f"       {'':18s} {what}: {check.remedy}")
    lines.append(REGISTRY[report.backend].preflight_line)
    return "\n".join(lines)
