"""Proof verbs: bench (each side in its own processes), the free frontier (recipes) and validate."""

from __future__ import annotations

from mcp_server.api.common import Cancel, record
from mcp_server.loop import Recorder
from mcp_server.progress import Progress, quiet
from mcp_server.proof.bench import bench as run_bench
from mcp_server.proof.bench import bench_file, load_bench_result
from mcp_server.proof.bench import summary_line as bench_line
from mcp_server.proof.recipes import RECIPES_JSON
from mcp_server.proof.recipes import recipes as run_recipes
from mcp_server.proof.validate import VALIDATION_JSON, generated_test_path, render_checks
from mcp_server.proof.validate import validate as run_validate
from mcp_server.rundir import dropped_if_empty, files_under, output_folder
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import read_model
from mcp_server.schema.optimizations import load_optimizations
from mcp_server.schema.requests import (
    BenchRequest,
    RecipesRequest,
    ValidateRequest,
)
from mcp_server.schema.results import (
    BenchSideSummary,
    BenchToolResult,
    InterpreterInfo,
    RecipeRow,
    RecipesResult,
    ValidateToolResult,
)
from mcp_server.schema.types import TIERS


def bench(req: BenchRequest, progress: Progress = quiet, cancel: Cancel = None) -> BenchToolResult:
    """Time the two workloads, each side in its own fresh processes, rounds alternating: bench.json."""
    progress(f"bench: {req.baseline.name} ({req.baseline_mode}) against {req.optimized.name} under {req.python.python}")
    with dropped_if_empty(output_folder(req.output, req.project, req.optimized, "bench")) as out:
        loop = Recorder(out, "bench", [req.baseline, req.optimized], [req.baseline, req.optimized])
        result = run_bench(req.baseline, req.optimized, python=req.python.python, options=req.timing,
                           rounds=req.rounds, baseline_mode=req.baseline_mode, tier=req.tier, recipes=req.recipes,
                           out_dir=out, timeout_s=req.timeout_s, progress=progress, cancel=cancel,
                           interleave=req.interleave)
        record(loop, [out / bench_file(req.baseline_mode)], progress)
    sides = {name: BenchSideSummary(workload=s.workload, how_run=s.how_run, recipe=s.recipe,
                                    first_call_ns=s.first_call_ns, latency=s.latency, back_to_back=s.back_to_back)
             for name, s in (("baseline", result.baseline), ("optimized", result.optimized))}
    return BenchToolResult(
        bench_path=str(out / bench_file(req.baseline_mode)), out_dir=str(out), files=files_under(out),
        summary=bench_line(result), headline=result.headline, speedup=result.speedup,
        latency_speedup=result.latency_speedup, back_to_back_speedup=result.back_to_back_speedup,
        baseline=sides["baseline"], optimized=sides["optimized"],
        device_type=result.device_type, device_name=result.device_name, timer=result.timer,
        interpreter=InterpreterInfo(python=req.python.python, source=req.python.source,
                                    executable=result.python_executable, torch_version=result.torch_version),
        warnings=result.warnings,
    )
def recipes(req: RecipesRequest, progress: Progress = quiet, cancel: Cancel = None,
            runoff_tiers: tuple[str, ...] = TIERS) -> RecipesResult:
    """Measure the free frontier of a workload: recipes.json, frontier.png and the table; the runoff
    (`req.timing.runoff`) is for the races of `runoff_tiers`."""
    from mcp_server.render.frontier import FRONTIER_PNG, format_recipes, frontier_chart  # matplotlib: only here

    progress(f"recipes: the free frontier of {req.workload.name} under {req.python.python}")
    with dropped_if_empty(output_folder(req.output, req.project, req.workload, "recipes")) as out:
        loop = Recorder(out, "recipes", [req.workload], [req.workload])
        report = run_recipes(req.workload, python=req.python.python, options=req.timing, seeds=req.seeds,
                             thorough=req.thorough, only=req.only, jobs=req.jobs, out_dir=out,
                             timeout_s=req.timeout_s, progress=progress, cancel=cancel, runoff=req.timing.runoff,
                             runoff_tiers=runoff_tiers)
        chart = frontier_chart(report, out / FRONTIER_PNG)
        record(loop, [out / RECIPES_JSON], progress)
    metric = req.timing.headline
    rows = [RecipeRow(recipe=r.recipe, status=r.status, tier=r.tier, reason=r.reason,
                      latency_ms=_ms(r.time_ns("latency")), back_to_back_ms=_ms(r.time_ns("back_to_back")),
                      max_rel_error=r.error.max_rel_error if r.error is not None else None) for r in report.results]
    return RecipesResult(
        recipes_path=str(out / RECIPES_JSON), frontier_chart=str(chart) if chart else None, out_dir=str(out),
        files=files_under(out), summary=format_recipes(report, metric),
        device=report.device_name or report.device_type, headline=metric, winners=report.winners, recipes=rows,
        skipped=report.skipped, warnings=report.warnings,
        interpreter=InterpreterInfo(python=req.python.python, source=req.python.source,
                                    executable=report.python_executable, torch_version=report.torch_version),
    )
def _ms(ns: float | None) -> float | None:
    return round(ns / 1e6, 6) if ns is not None else None
def validate(req: ValidateRequest, progress: Progress = quiet, cancel: Cancel = None) -> ValidateToolResult:
    """Check the optimized workload against the baseline: validation_report.json."""
    speedup, baseline_ns = req.speedup, None
    if req.bench_json is not None:
        bench_result = load_bench_result(req.bench_json)
        speedup = bench_result.speedup.point
        baseline_ns = bench_result.baseline.summary_of(bench_result.headline).median_ns
    bound = req.max_plausible_speedup
    if bound is None and req.analysis is not None:
        sol = read_model(req.analysis, Analysis, "analysis.json", "run `analyze` on the baseline's profile"
                         ).speed_of_light
        if sol is not None:
            # The floor is a time: a bench whose baseline ran faster than the analysed window (a free recipe, the
            # frontier's winner) leaves less room above it.
            bound = (baseline_ns if baseline_ns is not None else sol.window_ns) / sol.plausible_floor_ns
            progress(f"validate: a speedup above {bound:.2f}x is suspect (the baseline's plausible floor "
                     f"{sol.plausible_floor_ns / 1e6:.3f} ms, {req.analysis})")
    progress(f"validate: {req.optimized.name} against {req.baseline.name} under {req.python.python}")
    with dropped_if_empty(output_folder(req.output, req.project, req.optimized, "validate")) as out:
        tests = generated_test_path(req.optimized) if req.run_tests else None
        loop = Recorder(out, "validate", [req.baseline, req.optimized, tests, req.bench_json, req.analysis,
                                          req.optimizations], [req.baseline, req.optimized])
        report = run_validate(req.baseline, req.optimized, python=req.python.python, seeds=req.seeds, rtol=req.rtol,
                              atol=req.atol, tolerances=req.tolerances, run_tests=req.run_tests, speedup=speedup,
                              max_plausible_speedup=bound, out_dir=out, timeout_s=req.timeout_s,
                              progress=progress, cancel=cancel, tier=req.tier,
                              plan=load_optimizations(req.optimizations) if req.optimizations else None)
        record(loop, [out / VALIDATION_JSON], progress)
    return ValidateToolResult(
        report_path=str(out / VALIDATION_JSON), out_dir=str(out), files=files_under(out),
        passed=report.passed, failed_checks=report.failed_checks, summary=render_checks(report).splitlines()[0],
        checks=report.checks, device_type=report.device_type, device_name=report.device_name,
        max_abs_error=report.max_abs_error, max_rel_error=report.max_rel_error, speedup=report.speedup,
        max_plausible_speedup=report.max_plausible_speedup, precision_note=report.precision_note,
        interpreter=InterpreterInfo(python=req.python.python, source=req.python.source,
                                    executable=report.python_executable, torch_version=report.torch_version),
        warnings=report.warnings,
    )
