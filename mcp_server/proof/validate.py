"""Validate: is an optimized workload still right, and is its speedup plausible?

The contract of an optimized workload is in docs/optimized-workload-contract.md. The numerical checks run in a
child process under the workload's interpreter (`children/validate.py`): both models on the baseline's
weights, several seeds, the workload's own inputs and fresh random ones, dtype-aware tolerances, NaN/Inf,
shapes and dtypes, input mutation, outputs aliased to inputs or cached across calls, the backend registered
and invoked, the FX passes it applied. This module adds two checks of its own: the workload's generated
pytest file (`test_<name>_optimized.py` beside it, run as a child) and a measured speedup above a roofline
bound ('suspect'). It writes validation_report.json.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mcp_server.children.contract import written_floor
from mcp_server.errors import ProfileFormatError, UsageError
from mcp_server.process import interpreter_env, run_child
from mcp_server.process.child import log_tail
from mcp_server.progress import Progress, quiet
from mcp_server.proof import check_python, check_workload, run_proof_child
from mcp_server.schema.io import read_model, write_model_atomic
from mcp_server.schema.optimizations import OptimizationPlan
from mcp_server.schema.proof import CheckResult, ValidationReport
from mcp_server.schema.recipes import TIER_RTOL
from mcp_server.schema.types import TIERS

VALIDATION_JSON = "validation_report.json"
DEFAULT_SEEDS = (0, 1, 2)
TOLERANCE_CLASSES = ("float64", "float32", "tf32", "bfloat16", "float16")
PYTEST_TAIL_LINES = 15


def generated_test_path(optimized: Path) -> Path:
    """Where the generated pytest file of an optimized workload lives: `test_<stem>.py` beside it."""
    return Path(optimized).with_name(f"test_{Path(optimized).stem}.py")


def parse_seeds(value: str) -> tuple[int, ...]:
    """`'0,1,2'` (the CLI's --seeds) as seeds; a UsageError for anything but comma-separated integers."""
    try:
        seeds = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--seeds {value!r} is not a comma-separated list of integers", "pass e.g. --seeds 0,1,2") \
            from None
    if not seeds:
        raise UsageError("--seeds names no seed", "pass e.g. --seeds 0,1,2")
    return seeds


def parse_tolerances(values: Sequence[str]) -> dict[str, float]:
    """`['float32=1e-3', 'bfloat16=2e-2']` (the CLI's repeated --tolerance) as {class: rtol}."""
    tolerances = {}
    for value in values:
        name, sep, number = value.partition("=")
        try:
            tolerances[name.strip()] = float(number)
        except ValueError:
            sep = ""
        if not sep:
            raise UsageError(f"--tolerance {value!r} is not CLASS=RTOL", "pass e.g. --tolerance float32=1e-3")
    _check_options((0,), None, None, tolerances, None)
    return tolerances


def _check(name: str, status: str, detail: str) -> CheckResult:
    return CheckResult(name=name, status=status, passed=status != "fail", detail=detail)  # type: ignore[arg-type]


def run_pytest(
    test_file: Path,
    python: str,
    work_dir: Path,
    timeout_s: float,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
) -> CheckResult:
    """Run `python -m pytest -q test_file` as a child; pass/fail with the output's tail."""
    if not test_file.is_file():
        return _check("pytest", "skip", f"no generated test file {test_file.name} beside the optimized workload")
    log = work_dir / "pytest_child.log"
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
    code, timed_out = run_child(cmd, log, timeout_s, progress, cancel, env=interpreter_env(python))
    tail = log_tail(log, PYTEST_TAIL_LINES)
    if timed_out:
        return _check("pytest", "fail", f"{test_file.name} ran past {timeout_s:.0f} s and was stopped; tail: {tail}")
    if code == 0:
        return _check("pytest", "pass", f"{test_file.name} passed: {log_tail(log, 1)}")
    if "No module named pytest" in tail:
        return _check("pytest", "skip", f"pytest is not installed for {python}: {test_file.name} was not run")
    if code == 5:
        return _check("pytest", "fail", f"{test_file.name} collected no tests")
    return _check("pytest", "fail", f"{test_file.name} failed (exit {code}): {tail}")


def speedup_check(speedup: float | None, max_plausible_speedup: float | None) -> CheckResult:
    """Flag a measured speedup above the roofline bound as suspect (skip when either is unknown)."""
    if speedup is None or max_plausible_speedup is None:
        missing = "measured speedup given (run bench)" if speedup is None else "roofline bound given"
        return _check("speedup_plausible", "skip", f"not checked: no {missing}")
    if speedup > max_plausible_speedup:
        return _check(
            "speedup_plausible", "fail",
            f"suspect: the measured speedup {speedup:.2f}× exceeds the roofline bound {max_plausible_speedup:.2f}×; "
            "an optimized workload that skips work, caches results or measures something else looks like this",
        )
    return _check("speedup_plausible", "pass",
                  f"the measured speedup {speedup:.2f}× is within the roofline bound {max_plausible_speedup:.2f}×")


def planned_passes_check(plan: OptimizationPlan | None, applied: dict[str, int]) -> CheckResult:
    """Every item the plan marks implemented fired its own pass: a configuration item's count cannot stand in
    for a graph rewrite that matched nothing (skip without a plan)."""
    if plan is None:
        return _check("planned_passes", "skip", "not checked: no optimizations.json given")
    implemented = [item for item in plan.items if item.status == "implemented"]
    silent = [item.pass_name for item in implemented if applied.get(item.pass_name, 0) < 1]
    if silent:
        return _check("planned_passes", "fail", f"implemented items whose pass never applied: {', '.join(silent)} "
                      "(APPLIED_PASSES has no count for them): fix the pass or mark the item deferred")
    return _check("planned_passes", "pass", f"all {len(implemented)} implemented items applied their passes: "
                  + ", ".join(f"{i.pass_name} ×{applied[i.pass_name]}" for i in implemented))


def _child_args(
    base: Path, opt: Path, seeds: Sequence[int], rtol: float | None, atol: float | None,
    tolerances: dict[str, float] | None, tier: str,
) -> list[str]:
    args = ["--baseline", str(base), "--optimized", str(opt), "--seeds", ",".join(str(s) for s in seeds),
            "--tier", tier]
    if tolerances:
        args += ["--tolerances", json.dumps(tolerances)]
    if rtol is not None:
        args += ["--rtol", repr(float(rtol))]
    if atol is not None:
        args += ["--atol", repr(float(atol))]
    return args


def _check_options(
    seeds: Sequence[int], rtol: float | None, atol: float | None, tolerances: dict[str, float] | None,
    max_plausible_speedup: float | None,
) -> None:
    if not seeds:
        raise UsageError("no seeds given", "pass at least one seed, e.g. --seeds 0,1,2")
    for name, value in (("--rtol", rtol), ("--atol", atol), ("--max-plausible-speedup", max_plausible_speedup)):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise UsageError(f"{name} must be a non-negative number, got {value}", f"pass a value like 1e-4 to {name}")
    for key, value in (tolerances or {}).items():
        if key not in TOLERANCE_CLASSES:
            raise UsageError(f"unknown tolerance class {key!r}", f"choose among {', '.join(TOLERANCE_CLASSES)}")
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"tolerance for {key} must be positive, got {value}", "pass e.g. float32=1e-4")


def _report(
    raw: dict[str, Any], base: Path, opt: Path, python: str, extra: list[CheckResult],
    speedup: float | None, max_plausible_speedup: float | None, atol: float | None,
) -> ValidationReport:
    env = raw.get("environment", {})
    flags = raw.get("precision_flags", {})
    tf32 = [k for k in ("cuda_matmul_allow_tf32", "cudnn_allow_tf32") if flags.get(k)]
    precision = None
    if flags:
        cls = "tf32" if raw.get("tf32") else "float32"
        rtol = raw.get("tolerances", {}).get(cls)
        regime = f"float32 outputs held to the {cls} class" + (f" (rtol {rtol:g})" if rtol is not None else "")
        allowed = (f"TF32 allowed by {', '.join(tf32)}" if tf32 else "TF32 off") if env.get("cuda_available") \
            else "TF32 does not apply on the CPU"  # torch's cuDNN flag defaults to True on every machine
        precision = f"float32 matmul precision {flags.get('float32_matmul_precision')!r}; {allowed}; {regime}"
        written = raw.get("written_max_rel_error")
        if written is not None:
            precision += (f"; the baseline is written in bfloat16/float16 and is {written:.2g} from itself in float32 "
                          "(largest relative error): every tolerance is at least twice that, "
                          f"{written_floor(written):.2g}")
    try:
        checks = [CheckResult.model_validate(c) for c in raw.get("checks", [])] + extra
        failed = [c.name for c in checks if c.status == "fail"]
        return ValidationReport(
            baseline=str(base), optimized=str(opt), python_executable=env.get("python_executable", python),
            torch_version=env.get("torch_version"),
            device_type="cuda" if env.get("cuda_available") else "cpu",
            device_name=env.get("device_name"),
            seeds=raw.get("seeds", []), backend_name=raw.get("backend_name"), recipe=raw.get("recipe"),
            backend_calls=raw.get("backend_calls"), applied_passes=raw.get("applied_passes", {}),
            tolerances=raw.get("tolerances", {}), atol_override=atol, precision_note=precision,
            max_abs_error=raw.get("max_abs_error"), max_rel_error=raw.get("max_rel_error"),
            speedup=speedup, max_plausible_speedup=max_plausible_speedup,
            checks=checks, passed=not failed, failed_checks=failed, warnings=raw.get("warnings", []),
        )
    except ValidationError as exc:
        raise ProfileFormatError(
            f"the validate child's result is malformed: {exc.error_count()} errors ({exc.errors()[0]['msg']})",
            "report this as a bug with the child's JSON attached",
        ) from exc


def validate(
    baseline: Path,
    optimized: Path,
    python: str = sys.executable,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: dict[str, float] | None = None,
    run_tests: bool = True,
    speedup: float | None = None,
    max_plausible_speedup: float | None = None,
    out_dir: Path | None = None,
    timeout_s: float = 600.0,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    tier: str = "exact",
    plan: OptimizationPlan | None = None,
) -> ValidationReport:
    """Check `optimized` against `baseline` (two workload files) and return the report.

    `rtol` overrides every floating tolerance class, `tolerances` single classes (float64, float32, tf32,
    bfloat16, float16: rtol); `atol` replaces the default absolute tolerance (rtol × the output's RMS).
    `run_tests` runs the generated `test_<name>_optimized.py`. A `speedup` (from bench) above
    `max_plausible_speedup` (the roofline bound) fails 'speedup_plausible' as suspect. With `out_dir`,
    validation_report.json and the children's logs are written there; setting `cancel` stops the children.
    With `plan` (optimizations.json), 'planned_passes' checks that every implemented item fired its own pass.
    `tier` 'reduced' holds float32 outputs (and the TF32 class) to its TIER_RTOL unless `tolerances` names them:
    the tolerance of lower-precision compute the user chose; it also accepts a float32/float64 output returned
    in bfloat16 or float16 (as autocast returns it), compared after upcasting and reported with both dtypes.
    'fp8' does the same at its own TIER_RTOL, which also holds bfloat16 and float16 outputs (an FP8 GEMM's error
    reaches them whatever their dtype). 'exact' keeps the fp32 defaults and the baseline's dtypes.
    A failed check is a verdict, not an
    exception; a baseline that cannot run, or an interpreter without torch, raises WorkloadError.
    """
    _check_options(seeds, rtol, atol, tolerances, max_plausible_speedup)
    if tier not in TIERS:
        raise UsageError(f"unknown precision tier {tier!r}", f"choose one of {', '.join(TIERS)}")
    if tier != "exact":
        held = ("float32", "tf32") if tier == "reduced" else ("float32", "tf32", "bfloat16", "float16")
        tolerances = {**dict.fromkeys(held, TIER_RTOL[tier]), **(tolerances or {})}
    base_path, opt_path = check_workload(baseline, "baseline"), check_workload(optimized, "optimized")
    python = check_python(python)
    args = _child_args(base_path, opt_path, seeds, rtol, atol, tolerances, tier)
    with tempfile.TemporaryDirectory(prefix="operator_profiler_validate_") as scratch:
        work_dir = Path(scratch)  # the children's files: kept in out_dir only when one fails
        raw = run_proof_child("validate", args, python, work_dir, "validate", timeout_s, progress, cancel,
                              keep_failed_log=out_dir)
        extra = []
        if run_tests:
            progress(f"validate: running {generated_test_path(opt_path).name}")
            extra.append(run_pytest(generated_test_path(opt_path), python, work_dir, timeout_s, progress, cancel))
        else:
            extra.append(_check("pytest", "skip", "not run (run_tests is off)"))
    extra.append(speedup_check(speedup, max_plausible_speedup))
    extra.append(planned_passes_check(plan, raw.get("applied_passes", {})))
    report = _report(raw, base_path, opt_path, python, extra, speedup, max_plausible_speedup, atol)
    report.tier = tier
    if out_dir is not None:
        write_model_atomic(Path(out_dir) / VALIDATION_JSON, report)
    return report


def load_validation_report(path: Path) -> ValidationReport:
    """Read a validation_report.json."""
    return read_model(Path(path), ValidationReport, "validation report", "run `operator-profiler validate` (again)")


def render_checks(report: ValidationReport) -> str:
    """The verdict and one line per check, for the CLI."""
    lines = [f"{'PASS' if report.passed else 'FAIL'}: {Path(report.optimized).name} against "
             f"{Path(report.baseline).name} on {report.device_name or report.device_type} "
             f"(seeds {', '.join(str(s) for s in report.seeds)})"]
    for check in report.checks:
        lines.append(f"  [{check.status:4}] {check.name}: {check.detail}")
    for warning in report.warnings:
        lines.append(f"  warning: {warning}")
    return "\n".join(lines)
