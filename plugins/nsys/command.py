"""Locating nsys and building its command lines (capture only the cudaProfilerApi window)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from plugins.executables import find_executable

NSYS_GLOBS = [
    "/opt/nvidia/nsight-systems*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
]
DEFAULT_TRACE = ("cuda", "nvtx")
OPTIONAL_TRACE = ("osrt", "cudnn", "cublas")


def find_nsys() -> str | None:
    """nsys from $NSYS, PATH, /opt/nvidia/nsight-systems*, or the copy inside Nsight Compute's host folder."""
    return find_executable("nsys", "NSYS", NSYS_GLOBS)


def capture_command(nsys: str, report_base: Path, extra_trace: tuple[str, ...] = ()) -> list[str]:
    """The nsys prefix that records only the cudaProfilerStart/Stop window of the command that follows."""
    unknown = [t for t in extra_trace if t not in OPTIONAL_TRACE]
    if unknown:
        raise ValueError(f"unknown nsys trace {unknown}; choose from {list(OPTIONAL_TRACE)}")
    return [
        nsys, "profile",
        f"--trace={','.join(DEFAULT_TRACE + tuple(extra_trace))}",
        "--sample=none", "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "--cuda-graph-trace=node",
        "--force-overwrite=true",
        f"--output={report_base}",
    ]


def export_command(nsys: str, report: Path, sqlite: Path) -> list[str]:
    """Export an .nsys-rep to SQLite."""
    return [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={sqlite}", str(report)]


def importer_problems(nsys: str, timeout_s: float = 20.0) -> list[str]:
    """Libraries nsys's report importer (QdstrmImporter) cannot load; empty when fine or not checkable.

    A bundled nsys whose importer lacks a library (libdw.so.1, typically) records a capture but leaves only a
    .qdstrm behind instead of the .nsys-rep. A wrapper script (not an ELF binary) is not checked.
    """
    real = Path(nsys).resolve()
    try:
        if real.read_bytes()[:4] != b"\x7fELF":
            return []
    except OSError:
        return []
    candidates = [real.parent / "QdstrmImporter", real.parent.parent / "host-linux-x64" / "QdstrmImporter"]
    importer = next((c for c in candidates if c.is_file()), None)
    ldd = shutil.which("ldd")
    if importer is None or ldd is None:
        return []
    try:
        proc = subprocess.run([ldd, str(importer)], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted({line.split("=>")[0].strip() for line in proc.stdout.splitlines() if "not found" in line})
