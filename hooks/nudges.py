"""What the PostToolUse hook says about each file the loop writes (pure functions, standard library only)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hooklib import run_engine

IMPLEMENTED = {"implemented", "deferred"}  # the implement stage's statuses: its brief is not rendered again
PROFILE_NAMES = re.compile(r"^profile(_[A-Za-z0-9]+)?\.json$")
CONTRACT_NAMES = {
    "get_model_and_input": r"\bget_model_and_input\b",
    "BACKEND_NAME": r"^BACKEND_NAME\s*[:=]",
    "a registered backend": r"register_backend\s*\(",
    "APPLIED_PASSES": r"^APPLIED_PASSES\b",
    "optimize(model)": r"^def optimize\s*\(",
}


def kind_of(path: Path) -> str | None:
    """'profile', 'optimizations' or 'optimized' for the files the loop watches, else None."""
    if PROFILE_NAMES.match(path.name):
        return "profile"
    if path.name == "optimizations.json":
        return "optimizations"
    if path.name.endswith("_optimized.py") and not path.name.startswith("test_"):
        return "optimized"
    return None


def on_profile(path: Path) -> tuple[str, str]:
    """(context, block reason) for a written profile.json: coverage, counters, the next step."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    meta, win = data.get("capture_metadata", {}), data.get("window", {})
    kernels, attributed = win.get("kernel_count", 0), win.get("attributed_kernel_time_pct")
    lines = [f"{path.name} written: {meta.get('device_name')} ({meta.get('tool')}, {meta.get('compile_mode')}), "
             f"{kernels} kernels, {attributed if attributed is not None else '?'} % of kernel time attributed."]
    if not meta.get("gpu_used", False):
        lines.append("CPU-only profile (CPU operator times): the loop optimizes for the CPU; says nothing of a GPU.")
    if attributed is not None and attributed < 99:
        lines.append("Attribution below 99 %: inspect unattributed_kernels before trusting per-operator numbers.")
    counted = win.get("kernels_with_counters")
    if meta.get("tool", "").startswith("nsys") and counted is not None and counted < kernels:
        lines.append(f"Only {counted}/{kernels} kernels carry ncu counters: run the map tool on the run directory.")
    lines.append("Next: analyze it (analyze tool), the free frontier (recipes tool), then propose.")
    return " ".join(lines), ""


def on_optimizations(path: Path) -> tuple[str, str]:
    """Validate optimizations.json against its schema with the engine; invalid files must be fixed."""
    proc, plan = run_engine(["mcp_server.schema.optimizations", str(path)], 20.0), json.loads(path.read_text("utf-8"))
    if proc is None:
        return (f"{path.name} is valid JSON; the schema check needs the engine (render the plan with the report "
                "tool, which validates it).", "")
    if proc.returncode != 0:
        return "", f"{path} does not match schemas/optimizations.schema.json: {proc.stdout.strip()[:1500]}"
    if {i.get("status") for i in plan.get("items", [])} & IMPLEMENTED:
        return f"{proc.stdout.strip()}. Next: validate (/operator-profiler:validate).", ""  # the brief stays as is
    return (f"{proc.stdout.strip()}. Next: render proposal.md and implementation.md with the report tool in plan "
            "mode, then implement (/operator-profiler:implement).", "")


def on_optimized(path: Path) -> tuple[str, str]:
    """Check an optimized workload for the contract's names and its generated test."""
    text = path.read_text(encoding="utf-8")
    missing = [name for name, pattern in CONTRACT_NAMES.items() if not re.search(pattern, text, re.MULTILINE)]
    if missing:
        return "", (f"{path.name} lacks {', '.join(missing)} required by the optimized-workload contract "
                    "(docs/optimized-workload-contract.md).")
    test = path.with_name(f"test_{path.stem}.py")
    if not test.is_file():
        return f"{path.name} follows the contract; write its test {test.name} next, then run it.", ""
    return (f"{path.name} follows the contract. Next: run {test.name} with pytest, then validate "
            "(/operator-profiler:validate).", "")


NUDGES = {"profile": on_profile, "optimizations": on_optimizations, "optimized": on_optimized}
