"""What the long tools do, as blocking functions of (progress, cancel, options): the engine calls the CLI makes.

Each runs in a worker thread (tools.runner.run_engine), resolves the caller's paths against the project,
chooses the interpreter, calls the engine with `progress` and `cancel`, and returns the tool's result model.
This module imports the engine; the server imports it on first use only.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from mcp_server.bench import bench, load_bench_result
from mcp_server.bench import summary_line as bench_line
from mcp_server.compare import compare_paths
from mcp_server.errors import BackendUnavailable, UsageError
from mcp_server.pipeline.capture import CaptureRequest
from mcp_server.pipeline.passes import NcuOptions
from mcp_server.pipeline.profiling import ProfileResult, build_profile, capture, choose_backend, map_counters
from mcp_server.pipeline.rundir import MANIFEST, read_manifest
from mcp_server.preflight import format_report, preflight
from mcp_server.render.comparison import summary_line as compare_line
from mcp_server.render.comparison import write_comparison
from mcp_server.schema.io import load_profile
from mcp_server.schema.tools import (
    AnalyzeResult,
    BenchSideSummary,
    BenchToolResult,
    CompareResult,
    InterpreterInfo,
    PreflightCheck,
    PreflightResult,
    ProfileRun,
    ReportResult,
    ValidateToolResult,
)
from mcp_server.tools.interpreter import Interpreter, choose_python
from mcp_server.tools.paths import (
    files_under,
    output_dir,
    profile_file,
    project_dir,
    resolve,
    run_directory,
    workload_file,
)
from mcp_server.tools.queries import cached_profile, header, top_rows
from mcp_server.tools.runner import Progress
from mcp_server.validate import render_checks, validate

BACKEND_NAMES = {"torch": "torch.profiler (Kineto)", "nsys": "nsys timeline"}
TORCH_VERSION = re.compile(r"^torch (\S+)")


@contextlib.contextmanager
def _drop_if_empty(folder: Path) -> Iterator[Path]:
    """Remove `folder` again when the work inside fails before writing anything into it."""
    try:
        yield folder
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only succeeds when empty
        raise


def _option_value(value: str | None, name: str) -> None:
    if value is not None and value.startswith("-"):
        raise UsageError(f"{name} {value!r} looks like a command-line option", f"pass a plain value for {name}")


def _profile_run(result: ProfileResult, interp: Interpreter, note: str, top: int) -> ProfileRun:
    profile, run_dir = result.profile, result.run_dir
    meta = profile.capture_metadata
    if not meta.gpu_used:
        note += "; NO GPU USED: CUDA was not available to the workload, so times are CPU operator times"
    return ProfileRun(
        run_dir=str(run_dir), profile_path=str(result.profile_path), manifest_path=str(run_dir / MANIFEST),
        files=files_under(run_dir), backend=read_manifest(run_dir).backend, backend_note=note,
        interpreter=InterpreterInfo(python=interp.python, source=interp.source, executable=meta.python_executable,
                                    torch_version=meta.torch_version),
        profile=header(profile, result.profile_path), window=profile.window, top_operators=top_rows(profile, top),
        unattributed_kernel_count=len(profile.unattributed_kernels), warnings=profile.warnings, notes=meta.notes,
    )


def profile_workload(
    progress: Progress, cancel: threading.Event, *, workload: str, backend: str, counters: bool, compile_mode: str,
    warmup_iters: int, iters: int, seed: int, train_step: bool, python: str | None, output: str | None,
    timeout_s: float, top: int,
) -> ProfileRun:
    """Capture the workload's window into a fresh run directory and assemble profile.json."""
    path, interp = workload_file(workload), choose_python(python)
    chosen = choose_backend(backend)
    if counters and chosen != "nsys":
        raise BackendUnavailable(
            "counters=true needs the nsys backend (an NVIDIA GPU with nsys and ncu), not available here",
            "drop counters, or run on a GPU machine where `preflight` passes",
        )
    req = CaptureRequest(workload=path, run_dir=Path(), python=interp.python, compile_mode=compile_mode,
                         warmup_iters=warmup_iters, iters=iters, seed=seed, train_step=train_step, timeout_s=timeout_s)
    req.check()
    req = replace(req, run_dir=output_dir(output, path))
    label = BACKEND_NAMES[chosen] + (" + ncu counters" if counters else "")
    note = f"{backend} -> {label}" + (" (no NVIDIA GPU with nsys and ncu here)" if backend == "auto"
                                     and chosen == "torch" else "")
    progress(f"profile: {label} into {req.run_dir} under {interp.python}")
    command = ["operator-profiler", "run" if counters else "profile", str(path), "--backend", backend,
               "--compile-mode", compile_mode, "--warmup-iters", str(warmup_iters), "--iters", str(iters),
               "--seed", str(seed), "--python", interp.python, "--output", str(req.run_dir)]
    ncu = NcuOptions(cuda_graphs=compile_mode == "cudagraphs") if counters else None
    capture(req, chosen, command + (["--train-step"] if train_step else []), progress, ncu=ncu, cancel=cancel)
    return _profile_run(build_profile(req.run_dir, progress), interp, note, top)


def map_run(
    progress: Progress, cancel: threading.Event, *, run_dir: str, kernel_regex: str | None, launch_skip: int | None,
    launch_count: int | None, max_kernels: int | None, dedupe: bool, metric_set: str | None,
    sections: tuple[str, ...], ncu_sudo: bool,
    timeout_s: float, top: int,
) -> ProfileRun:
    """Replay a captured nsys run's kernels under ncu and rebuild its profile.json."""
    path = run_directory(run_dir)
    manifest = read_manifest(path)
    if manifest.backend != "nsys+ncu":
        raise UsageError(f"{path} was captured with backend {manifest.backend}",
                         "map needs a run captured with backend nsys (profile with backend='nsys' on a GPU machine)")
    checked = [(kernel_regex, "kernel_regex"), (metric_set, "metric_set"), *((s, "section") for s in sections)]
    for value, name in checked:
        _option_value(value, name)
    req = CaptureRequest(workload=Path(manifest.workload), run_dir=path, python=manifest.python,
                         compile_mode=manifest.compile_mode, warmup_iters=manifest.warmup_iters, iters=manifest.iters,
                         seed=manifest.seed, train_step=manifest.run_mode == "train_step", timeout_s=timeout_s)
    options = NcuOptions(dedupe=dedupe, kernel_regex=kernel_regex, launch_skip=launch_skip, launch_count=launch_count,
                         max_kernels=max_kernels,
                         sections=list(sections), metric_set=metric_set,
                         cuda_graphs=manifest.compile_mode == "cudagraphs", sudo=ncu_sudo)
    progress(f"map: ncu replay of {path} under {manifest.python}")
    map_counters(req, options, progress, cancel)
    return _profile_run(build_profile(path, progress), Interpreter(manifest.python, "manifest"),
                        "nsys+ncu: counters replayed by ncu at base clocks, durations from nsys at real clocks", top)


def assemble_run(progress: Progress, cancel: threading.Event, *, run_dir: str, top: int) -> ProfileRun:
    """Rebuild profile.json from a run directory's raw artifacts (no GPU, no workload)."""
    path = run_directory(run_dir)
    manifest = read_manifest(path)
    progress(f"assemble: {path}")
    return _profile_run(build_profile(path, progress), Interpreter(manifest.python, "manifest"),
                        f"{manifest.backend}: rebuilt from the recorded artifacts", top)


def analyze_run(
    progress: Progress, cancel: threading.Event, *, profile: str, output: str | None, measure: bool
) -> AnalyzeResult:
    """Diagnose a profile: analysis.json, trace.json and charts in a fresh directory."""
    from mcp_server.analysis import analyze_profile, format_summary  # charts import matplotlib: only here

    path = profile_file(profile)
    loaded = load_profile(path)
    out = output_dir(output, Path(loaded.capture_metadata.workload), "analysis")
    progress(f"analyze: {path}")
    analysis = analyze_profile(loaded, out, profile_path=path, measure=measure)
    return AnalyzeResult(
        analysis_path=analysis.artifacts.get("analysis.json", str(out / "analysis.json")), out_dir=str(out),
        files=files_under(out), summary=format_summary(analysis), profile=header(loaded, path),
        configuration=analysis.configuration, gpu_data=analysis.gpu_data, counters=analysis.counters,
        diagnosis=analysis.diagnosis, stages=analysis.stages, opportunities=analysis.opportunities,
        findings=analysis.findings, cpu_hotspots=analysis.cpu_hotspots, timeline=analysis.timeline,
        notes=analysis.notes,
    )


def compare_run(
    progress: Progress, cancel: threading.Event, *, baseline: str, optimized: str, allow_mismatch: bool,
    output: str | None, top: int,
) -> CompareResult:
    """Compare two profiles and write comparison.json and comparison.md into a fresh directory."""
    base, opt = profile_file(baseline), profile_file(optimized)
    progress(f"compare: {base} against {opt}")
    comparison = compare_paths(base, opt, allow_mismatch)
    out = output_dir(output, Path(comparison.optimized.workload), "compare")
    json_path, md_path = write_comparison(comparison, out)
    moved = sorted(comparison.operators, key=lambda d: abs(d.time_delta_ns), reverse=True)
    return CompareResult(
        comparison_path=str(json_path), markdown_path=str(md_path), files=files_under(out),
        summary=compare_line(comparison), time_basis=comparison.time_basis, baseline=comparison.baseline,
        optimized=comparison.optimized, totals=comparison.totals, match_counts=comparison.match_counts,
        operator_deltas=moved[:top], operator_delta_count=len(moved), new_casts=comparison.new_casts,
        mismatches=comparison.mismatches, warnings=comparison.warnings,
    )


def bench_run(
    progress: Progress, cancel: threading.Event, *, baseline: str, optimized: str, python: str | None, warmup: int,
    reps: int, rounds: int, input_sets: int, seed: int, baseline_mode: str, output: str | None, timeout_s: float,
) -> BenchToolResult:
    """Time the two workloads interleaved in one child; bench.json in a fresh directory."""
    base, opt = workload_file(baseline, "baseline workload"), workload_file(optimized, "optimized workload")
    interp = choose_python(python)
    progress(f"bench: {base.name} against {opt.name} under {interp.python}")
    with _drop_if_empty(output_dir(output, opt, "bench")) as out:
        result = bench(base, opt, python=interp.python, warmup=warmup, reps=reps, rounds=rounds,
                       input_sets=input_sets, seed=seed, baseline_mode=baseline_mode, out_dir=out,
                       timeout_s=timeout_s, progress=progress, cancel=cancel)
    sides = {name: BenchSideSummary(workload=s.workload, how_run=s.how_run, first_call_ns=s.first_call_ns,
                                    timing=s.summary)
             for name, s in (("baseline", result.baseline), ("optimized", result.optimized))}
    return BenchToolResult(
        bench_path=str(out / "bench.json"), out_dir=str(out), files=files_under(out), summary=bench_line(result),
        speedup=result.speedup, baseline=sides["baseline"], optimized=sides["optimized"],
        device_type=result.device_type, device_name=result.device_name, timer=result.timer,
        interpreter=InterpreterInfo(python=interp.python, source=interp.source,
                                    executable=result.python_executable, torch_version=result.torch_version),
        warnings=result.warnings,
    )


def validate_run(
    progress: Progress, cancel: threading.Event, *, baseline: str, optimized: str, python: str | None,
    seeds: tuple[int, ...], rtol: float | None, atol: float | None, tolerances: dict[str, float] | None,
    run_tests: bool, speedup: float | None, bench_json: str | None, max_plausible_speedup: float | None,
    output: str | None, timeout_s: float,
) -> ValidateToolResult:
    """Check the optimized workload against the baseline; validation_report.json in a fresh directory."""
    base, opt = workload_file(baseline, "baseline workload"), workload_file(optimized, "optimized workload")
    interp = choose_python(python)
    if bench_json is not None:
        speedup = load_bench_result(resolve(bench_json, "bench.json")).speedup.point
    progress(f"validate: {opt.name} against {base.name} under {interp.python}")
    with _drop_if_empty(output_dir(output, opt, "validate")) as out:
        report = validate(base, opt, python=interp.python, seeds=tuple(seeds), rtol=rtol, atol=atol,
                          tolerances=tolerances, run_tests=run_tests, speedup=speedup,
                          max_plausible_speedup=max_plausible_speedup, out_dir=out, timeout_s=timeout_s,
                          progress=progress, cancel=cancel)
    return ValidateToolResult(
        report_path=str(out / "validation_report.json"), out_dir=str(out), files=files_under(out),
        passed=report.passed, failed_checks=report.failed_checks, summary=render_checks(report).splitlines()[0],
        checks=report.checks, device_type=report.device_type, device_name=report.device_name,
        max_abs_error=report.max_abs_error, max_rel_error=report.max_rel_error, speedup=report.speedup,
        max_plausible_speedup=report.max_plausible_speedup, precision_note=report.precision_note,
        interpreter=InterpreterInfo(python=interp.python, source=interp.source,
                                    executable=report.python_executable, torch_version=report.torch_version),
        warnings=report.warnings,
    )


def report_run(
    progress: Progress, cancel: threading.Event, *, baseline_profile: str, optimized_profile: str | None,
    analysis: str | None, comparison: str | None, bench_json: str | None, validation: str | None,
    optimizations: str | None, output: str | None, plan: bool = False,
) -> ReportResult:
    """Render report.md (and OPTIMIZED_WORKLOAD.md), or in plan mode proposal.md and implementation.md."""
    from mcp_server.render import render_plan, render_report  # Jinja2 and the templates: only here

    base = profile_file(baseline_profile)
    optional = {name: resolve(value, name) if value else None for name, value in (
        ("analysis.json", analysis), ("comparison.json", comparison), ("bench.json", bench_json),
        ("validation_report.json", validation), ("optimizations.json", optimizations))}
    optimized = profile_file(optimized_profile) if optimized_profile else None
    with _drop_if_empty(output_dir(output, Path(cached_profile(base).capture_metadata.workload), "report")) as out:
        progress(f"report: rendering into {out}")
        if plan:
            if optional["optimizations.json"] is None:
                raise UsageError("plan mode needs optimizations", "pass the strategist's optimizations.json")
            written = render_plan(base, optional["optimizations.json"], out, analysis=optional["analysis.json"],
                                  project_dir=project_dir())
            by_name = {p.name: str(p) for p in written}
            return ReportResult(report_path=by_name.get("proposal.md", str(out / "proposal.md")), out_dir=str(out),
                                files=[str(p) for p in written])
        written = render_report(
            base, out, optimized_profile=optimized, analysis=optional["analysis.json"],
            comparison=optional["comparison.json"], bench=optional["bench.json"],
            validation=optional["validation_report.json"], optimizations=optional["optimizations.json"],
            project_dir=project_dir(),
        )
    by_name = {p.name: str(p) for p in written}
    return ReportResult(report_path=by_name.get("report.md", str(out / "report.md")),
                        optimized_workload_path=by_name.get("OPTIMIZED_WORKLOAD.md"), out_dir=str(out),
                        files=[str(p) for p in written])


def preflight_run(progress: Progress, cancel: threading.Event, *, python: str | None, quick: bool) -> PreflightResult:
    """GPU, driver, torch/CUDA under the chosen interpreter, nsys, ncu and counter permission."""
    interp = choose_python(python)
    progress(f"preflight: checking this machine and {interp.python}")
    report = preflight(interp.python, quick=quick)
    torch_check = next((c for c in report.checks if c.name == "torch"), None)
    found = TORCH_VERSION.match(torch_check.detail) if torch_check is not None and torch_check.detail else None
    return PreflightResult(
        ok=report.ok, checks=[PreflightCheck(**c.model_dump()) for c in report.checks], backend=report.backend,
        summary=format_report(report),
        interpreter=InterpreterInfo(python=interp.python, source=interp.source,
                                    torch_version=found.group(1) if found else None),
    )

