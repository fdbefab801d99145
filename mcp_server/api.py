"""The engine's facade: one function per verb, a typed request in, a schema model out.

The CLI (`cli.py`) and the MCP server (`server.py`) are faces over these functions: they parse arguments or
MCP parameters into the request, show progress, and print or return the result. Every verb has the signature
`verb(request, progress=quiet, cancel=None)`; `progress` receives phase lines and children's output, and setting
`cancel` stops any child the verb started (CancelledCapture). Imports of the heavier stages (analysis's charts,
Jinja2's templates, the memory pass's replay) happen inside the verbs that need them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from pathlib import Path

from mcp_server.assemble import assemble as assemble_profile
from mcp_server.assemble import write_profile
from mcp_server.capture.ranks import capture_ranks
from mcp_server.capture.request import CaptureRequest, WorkloadOptions, check_workload
from mcp_server.capture.schedule import capture, choose_backend, has_gpu, map_counters
from mcp_server.compare import compare_paths
from mcp_server.errors import BackendUnavailable, UsageError, WorkloadOutOfMemory
from mcp_server.loop import Recorder
from mcp_server.loop import loop_status as judge_loop
from mcp_server.loop.state import state_path
from mcp_server.preflight import format_report
from mcp_server.preflight import preflight as check_machine
from mcp_server.progress import Progress, quiet
from mcp_server.proof.bench import bench as run_bench
from mcp_server.proof.bench import bench_file, load_bench_result
from mcp_server.proof.bench import summary_line as bench_line
from mcp_server.proof.recipes import RECIPES_JSON
from mcp_server.proof.recipes import recipes as run_recipes
from mcp_server.proof.validate import VALIDATION_JSON, generated_test_path, render_checks
from mcp_server.proof.validate import validate as run_validate
from mcp_server.queries import header, top_operators_result, top_rows
from mcp_server.queries import kernel_detail as kernel_query
from mcp_server.queries import operator_detail as operator_query
from mcp_server.ranks.build import merge_run, write_events_of
from mcp_server.render.comparison import summary_line as compare_line
from mcp_server.render.comparison import write_comparison
from mcp_server.rundir import RANK_FOLDER, RANKS, RunDir, dropped_if_empty, files_under, output_folder, profile_file
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import load_profile, read_model
from mcp_server.schema.optimizations import load_optimizations
from mcp_server.schema.ranks import RanksSummary
from mcp_server.schema.requests import (
    AnalyzeRequest,
    AssembleRequest,
    BenchRequest,
    CompareRequest,
    Interpreter,
    KernelDetailRequest,
    LoopStatusRequest,
    MapRequest,
    MemoryRequest,
    NcuOptions,
    OperatorDetailRequest,
    PreflightRequest,
    ProfileRequest,
    RecipesRequest,
    ReportRequest,
    SummaryRequest,
    ValidateRequest,
    cli_flags,
)
from mcp_server.schema.results import (
    AnalyzeResult,
    BenchSideSummary,
    BenchToolResult,
    CompareResult,
    InterpreterInfo,
    KernelDetail,
    LoopStatusResult,
    MemoryRun,
    OperatorDetail,
    PreflightResult,
    ProfileRun,
    RecipeRow,
    RecipesResult,
    ReportResult,
    TopOperatorsResult,
    ValidateToolResult,
)

Cancel = threading.Event | None
PROGRAM = "operator-profiler"
BACKEND_NAMES = {"torch": "torch.profiler (Kineto)", "nsys": "nsys timeline"}
TORCH_VERSION = re.compile(r"^torch (\S+)")
NO_COUNTERS_HERE = (
    "no hardware counters: nsys and ncu need an NVIDIA GPU with Nsight Systems and Compute here (see "
    "`operator-profiler preflight`); profiling with torch.profiler instead"
)


# --------------------------------------------------------------------------------------------- capture


def profile(req: ProfileRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Capture the workload's window into a run directory and assemble profile.json; with `req.ncu`, replay
    its kernels under ncu too (the `run` verb)."""
    if req.memory and req.capture.script:
        raise UsageError("--memory needs get_model_and_input(): a script run as it is has none",
                         "drop --memory, or write the workload contract (see README)")
    chosen = choose_backend(req.backend)
    counters = req.ncu is not None and chosen == "nsys"
    if req.ncu is not None and not counters:
        if req.require_counters:
            raise BackendUnavailable(
                "counters need the nsys backend (an NVIDIA GPU with nsys and ncu), not available here",
                "drop counters, or run on a GPU machine where `preflight` passes",
            )
        progress(f"profile: {NO_COUNTERS_HERE}")
    check_workload(req.workload, req.python.python, req.capture.script)  # before any directory is made
    run_dir = RunDir(output_folder(req.output, req.project, req.workload))
    cap = CaptureRequest.of(req.workload, run_dir, req.python.python, req.capture)
    label = BACKEND_NAMES[chosen] + (" + ncu counters" if counters else "")
    note = f"{req.backend} -> {label}" + (
        " (no NVIDIA GPU with nsys and ncu here)" if req.backend == "auto" and chosen == "torch" else ""
    )
    progress(f"profile: {label} into {run_dir.path} under {req.python.python}")
    command = req.command_line or _equivalent_command(req, run_dir, counters)
    if req.memory and cap.distributed:
        raise UsageError("--memory records one process, not a torchrun launch", "drop --memory or --nproc-per-node")
    with run_dir.locked():
        run_dir.claim(req.workload)
        try:
            (capture_ranks if cap.distributed else capture)(
                cap, chosen, command, progress, ncu=req.ncu if counters else None, cancel=cancel, timing=has_gpu())
        except WorkloadOutOfMemory as exc:
            raise _diagnosed(cap, exc, progress, cancel) from None
        failed = []
        if req.memory:
            from mcp_server.memory.run import add_memory_pass

            failed = add_memory_pass(cap, progress, cancel)
        result = (_ranks_run if cap.distributed else _profile_run)(run_dir, req.python, note, req.top, progress)
    result.warnings += failed
    if req.ncu is not None and not counters:
        result.warnings.insert(0, NO_COUNTERS_HERE)
    return result


def run(req: ProfileRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """profile with ncu counters: the nsys timeline and the ncu replay (default options unless `req.ncu`)."""
    return profile(req if req.ncu is not None else req.model_copy(update={"ncu": NcuOptions()}), progress, cancel)


def map_run(req: MapRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Replay a captured nsys run's kernels under ncu and rebuild its profile.json."""
    run_dir = RunDir.existing(req.run_dir)
    manifest = run_dir.read_manifest()
    if manifest.backend != "nsys+ncu":
        raise UsageError(
            f"{run_dir.path} was captured with backend {manifest.backend}",
            "map needs a run captured with the nsys backend: profile with backend='nsys' (--backend nsys) on a GPU "
            "machine",
        )
    cap = CaptureRequest(
        workload=Path(manifest.workload), run_dir=run_dir, python=manifest.python, timeout_s=req.timeout_s,
        options=WorkloadOptions(compile_mode=manifest.compile_mode, warmup_iters=manifest.warmup_iters,
                                iters=manifest.iters, seed=manifest.seed, train_step=manifest.run_mode == "train_step"),
    )
    progress(f"map: ncu replay of {run_dir.path} under {manifest.python}")
    with run_dir.locked():
        try:
            map_counters(cap, req.ncu, progress, cancel)
        except WorkloadOutOfMemory as exc:
            raise _diagnosed(cap, exc, progress, cancel) from None
        return _profile_run(run_dir, Interpreter(python=manifest.python, source="manifest"),
                            "nsys+ncu: counters replayed by ncu at base clocks, durations from nsys at real clocks",
                            req.top, progress)


def assemble(req: AssembleRequest, progress: Progress = quiet, cancel: Cancel = None) -> ProfileRun:
    """Rebuild profile.json from a run directory's raw artifacts (no GPU, no workload)."""
    run_dir = RunDir.existing(req.run_dir)
    manifest = run_dir.read_manifest()
    progress(f"assemble: {run_dir.path}")
    if manifest.backend == "memory":
        raise UsageError(f"{run_dir.path} holds the memory pass alone: it has no profile to assemble",
                         "rebuild its memory.json with `operator-profiler memory RUN_DIR` (the memory tool)")
    with run_dir.locked():
        if manifest.distributed is not None and run_dir.ranks():
            return _ranks_run(run_dir, Interpreter(python=manifest.python, source="manifest"),
                              f"{manifest.backend}: rebuilt from the recorded artifacts", req.top, progress)
        return _profile_run(run_dir, Interpreter(python=manifest.python, source="manifest"),
                            f"{manifest.backend}: rebuilt from the recorded artifacts", req.top, progress)


def _diagnosed(cap: CaptureRequest, exc: WorkloadOutOfMemory, progress: Progress, cancel: Cancel
               ) -> WorkloadOutOfMemory:
    """A pass ran out of memory: the error with what held the memory (the memory pass, run up to the failure)."""
    from mcp_server.memory.run import diagnose_out_of_memory

    return diagnose_out_of_memory(cap, exc, progress, cancel)


def _ranks_run(run_dir: RunDir, interp: Interpreter, note: str, top: int, progress: Progress) -> ProfileRun:
    """Assemble every rank's profile.json and events, merge them into ranks.json; the first rank's digest with
    the merged view, naming every file of the run."""
    results = []
    for rank in run_dir.ranks():
        progress(f"rank {rank}: assembling profile.json")
        results.append(_profile_run(run_dir.rank_dir(rank), interp, note, top, progress))
    progress(f"merging {len(results)} ranks' events into ranks.json (DuckDB)")
    merged = merge_run(run_dir)
    first = results[0]
    return first.model_copy(update={
        "run_dir": str(run_dir.path), "manifest_path": str(run_dir.manifest_path), "files": run_dir.files(),
        "ranks_path": str(run_dir.ranks_path), "ranks": merged,
    })


def _profile_run(run_dir: RunDir, interp: Interpreter, note: str, top: int, progress: Progress) -> ProfileRun:
    """Assemble and write the run's profile.json; the result naming every file of the run."""
    progress("assembling profile.json")
    profile = assemble_profile(run_dir)
    path = write_profile(run_dir.profile_path, profile)
    write_events_of(run_dir, profile)
    memory_path = None
    if run_dir.read_manifest().pass_named("memory") is not None and run_dir.memory_record().is_file():
        from mcp_server.memory.run import write_memory

        progress("building memory.json")
        write_memory(run_dir)
        memory_path = str(run_dir.memory_path)
    meta = profile.capture_metadata
    if not meta.gpu_used:
        note += "; NO GPU USED: CUDA was not available to the workload, so times are CPU operator times"
    return ProfileRun(
        run_dir=str(run_dir.path), profile_path=str(path), manifest_path=str(run_dir.manifest_path),
        files=run_dir.files(), backend=run_dir.read_manifest().backend, backend_note=note,
        interpreter=InterpreterInfo(python=interp.python, source=interp.source, executable=meta.python_executable,
                                    torch_version=meta.torch_version),
        profile=header(profile, path), window=profile.window, top_operators=top_rows(profile, top),
        unattributed_kernel_count=len(profile.unattributed_kernels), warnings=profile.warnings, notes=meta.notes,
        memory_path=memory_path,
    )


def _equivalent_command(req: ProfileRequest, run_dir: RunDir, counters: bool) -> list[str]:
    """The CLI command that captures what `req` asks for, as the manifest records it."""
    script_args = req.capture.script_args  # after `--`: they may start with `-` themselves
    command = [PROGRAM, "run" if counters else "profile", str(req.workload), "--backend", req.backend,
               "--python", req.python.python, "--output", str(run_dir.path),
               *cli_flags(req.capture.model_copy(update={"script_args": ()}))]
    command += ["--memory"] if req.memory else []
    command += cli_flags(req.ncu) if counters and req.ncu is not None else []
    return command + (["--", *script_args] if script_args else [])


# --------------------------------------------------------------------------------------------- reading


def summary(req: SummaryRequest, progress: Progress = quiet, cancel: Cancel = None) -> TopOperatorsResult:
    """The window and the heaviest operators of a profile; its memory section when memory.json lies beside it."""
    path = profile_file(req.profile)
    result = top_operators_result(path, req.top)
    memory_path = RunDir(path.parent).memory_path
    if memory_path.is_file():
        from mcp_server.memory.run import load_memory
        from mcp_server.memory.text import memory_lines

        found = load_memory(path.parent)
        result.memory = "\n".join(memory_lines(found, memory_path)) if found is not None else None
    return result


def memory(req: MemoryRequest, progress: Progress = quiet, cancel: Cancel = None) -> MemoryRun:
    """Where every byte at the window's peak comes from: the memory pass of a workload (memory.json, its chart, the
    allocator's snapshot), or memory.json rebuilt from a run directory's memory pass (no GPU)."""
    from mcp_server.memory.run import memory as run_memory

    return run_memory(req, progress, cancel)


def operator_detail(req: OperatorDetailRequest, progress: Progress = quiet, cancel: Cancel = None) -> OperatorDetail:
    """One operator call: module path, shapes, fused operators, its kernels and their counters."""
    return operator_query(profile_file(req.profile), req.operator_id, req.max_kernels)


def kernel_detail(req: KernelDetailRequest, progress: Progress = quiet, cancel: Cancel = None) -> KernelDetail:
    """One kernel launch with every counter, its attribution and the launches sharing its counters."""
    return kernel_query(profile_file(req.profile), req.kernel_id)


def analyze(req: AnalyzeRequest, progress: Progress = quiet, cancel: Cancel = None) -> AnalyzeResult:
    """Diagnose a profile: analysis.json, trace.json and charts."""
    from mcp_server.analysis import analyze_profile, format_summary  # charts import matplotlib: only here

    path = profile_file(req.profile)
    loaded = load_profile(path)
    workload = Path(loaded.capture_metadata.workload)
    with dropped_if_empty(output_folder(req.output, req.project, workload, "analysis")) as out:
        progress(f"analyze: {path}")
        ranks = _ranks_of(path, progress)
        loop = Recorder(out, "analyze", [path, ranks[1] if ranks else None], [workload])
        analysis = analyze_profile(loaded, out, profile_path=path.resolve(), measure=req.measure, ranks=ranks)
        _record(loop, [analysis.artifacts.get("analysis.json", out / "analysis.json")], progress)
    return AnalyzeResult(
        analysis_path=analysis.artifacts.get("analysis.json", str(out / "analysis.json")), out_dir=str(out),
        files=files_under(out), summary=format_summary(analysis), profile=header(loaded, path),
        configuration=analysis.configuration, gpu_data=analysis.gpu_data, counters=analysis.counters,
        diagnosis=analysis.diagnosis, stages=analysis.stages, opportunities=analysis.opportunities,
        findings=analysis.findings, cpu_hotspots=analysis.cpu_hotspots, timeline=analysis.timeline,
        notes=analysis.notes, speed_of_light=analysis.speed_of_light, distributed=analysis.distributed,
    )


def _ranks_of(profile: Path, progress: Progress) -> tuple[RanksSummary, Path] | None:
    """ranks.json of the multi-rank run a rank's profile.json belongs to (`RUN/rank<R>/profile.json`), if any."""
    if not RANK_FOLDER.match(profile.parent.name):
        return None
    path = RunDir(profile.parent.parent).ranks_path
    if not path.is_file():
        return None
    progress(f"analyze: the multi-rank view from {path}")
    return read_model(path, RanksSummary, RANKS, "re-run `assemble` on the run directory"), path


def compare(req: CompareRequest, progress: Progress = quiet, cancel: Cancel = None) -> CompareResult:
    """Compare two profiles: comparison.json and comparison.md."""
    base, opt = profile_file(req.baseline), profile_file(req.optimized)
    progress(f"compare: {base} against {opt}")
    comparison = compare_paths(base, opt, req.allow_mismatch)
    with dropped_if_empty(output_folder(req.output, req.project, Path(comparison.optimized.workload),
                                        "compare")) as out:
        loop = Recorder(out, "compare", [base, opt], [comparison.baseline.workload, comparison.optimized.workload])
        json_path, md_path = write_comparison(comparison, out)
        _record(loop, [json_path, md_path], progress)
    moved = sorted(comparison.operators, key=lambda d: abs(d.time_delta_ns), reverse=True)
    return CompareResult(
        comparison_path=str(json_path), markdown_path=str(md_path), files=files_under(out),
        summary=compare_line(comparison), time_basis=comparison.time_basis, baseline=comparison.baseline,
        optimized=comparison.optimized, totals=comparison.totals, match_counts=comparison.match_counts,
        operator_deltas=moved[:req.top], operator_delta_count=len(moved), new_casts=comparison.new_casts,
        mismatches=comparison.mismatches, warnings=comparison.warnings,
    )


# --------------------------------------------------------------------------------------------- proof


def bench(req: BenchRequest, progress: Progress = quiet, cancel: Cancel = None) -> BenchToolResult:
    """Time the two workloads, each side in its own fresh processes, rounds alternating: bench.json."""
    progress(f"bench: {req.baseline.name} ({req.baseline_mode}) against {req.optimized.name} under {req.python.python}")
    with dropped_if_empty(output_folder(req.output, req.project, req.optimized, "bench")) as out:
        loop = Recorder(out, "bench", [req.baseline, req.optimized], [req.baseline, req.optimized])
        result = run_bench(req.baseline, req.optimized, python=req.python.python, options=req.timing,
                           rounds=req.rounds, baseline_mode=req.baseline_mode, tier=req.tier, recipes=req.recipes,
                           out_dir=out, timeout_s=req.timeout_s, progress=progress, cancel=cancel)
        _record(loop, [out / bench_file(req.baseline_mode)], progress)
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


def recipes(req: RecipesRequest, progress: Progress = quiet, cancel: Cancel = None) -> RecipesResult:
    """Measure the free frontier of a workload: recipes.json, frontier.png and the table."""
    from mcp_server.render.frontier import FRONTIER_PNG, format_recipes, frontier_chart  # matplotlib: only here

    progress(f"recipes: the free frontier of {req.workload.name} under {req.python.python}")
    with dropped_if_empty(output_folder(req.output, req.project, req.workload, "recipes")) as out:
        loop = Recorder(out, "recipes", [req.workload], [req.workload])
        report = run_recipes(req.workload, python=req.python.python, options=req.timing, seeds=req.seeds,
                             thorough=req.thorough, only=req.only, jobs=req.jobs, out_dir=out,
                             timeout_s=req.timeout_s, progress=progress, cancel=cancel)
        chart = frontier_chart(report, out / FRONTIER_PNG)
        _record(loop, [out / RECIPES_JSON], progress)
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
        _record(loop, [out / VALIDATION_JSON], progress)
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


# --------------------------------------------------------------------------------------------- documents


def report(req: ReportRequest, progress: Progress = quiet, cancel: Cancel = None) -> ReportResult:
    """Render report.md (and OPTIMIZED_WORKLOAD.md), or with `plan` proposal.md and implementation.md."""
    from mcp_server.render import load_inputs, write_plan, write_report  # Jinja2 and the templates: only here

    base = profile_file(req.baseline_profile)
    optimized = profile_file(req.optimized_profile) if req.optimized_profile else None
    if req.plan and req.optimizations is None:
        raise UsageError("plan mode needs optimizations", "pass the optimizations.json the strategist wrote")
    if req.plan:
        inputs = load_inputs(base, analysis=req.analysis, optimizations=req.optimizations)
    else:
        inputs = load_inputs(base, optimized, analysis=req.analysis, comparison=req.comparison, bench=req.bench_json,
                             validation=req.validation, optimizations=req.optimizations,
                             baseline_analysis=req.baseline_analysis, recipes=req.recipes,
                             bench_vs_free=req.bench_vs_free)
    workloads = [p.capture_metadata.workload for p in (inputs.baseline, inputs.optimized) if p is not None]
    with dropped_if_empty(output_folder(req.output, req.project, Path(workloads[0]), "report")) as out:
        progress(f"report: rendering into {out}")
        loop = Recorder(out, "report", inputs.paths(), workloads)
        written = (write_plan if req.plan else write_report)(inputs, out, req.project)
        main = "proposal.md" if req.plan else "report.md"
        _record(loop, written, progress)
    by_name = {p.name: str(p) for p in written}
    return ReportResult(report_path=by_name.get(main, str(out / main)),
                        optimized_workload_path=by_name.get("OPTIMIZED_WORKLOAD.md"), out_dir=str(out),
                        files=[str(p) for p in written])


def _record(loop: Recorder, written: Iterable[Path | str], progress: Progress) -> None:
    """Record the loop checkpoints among `written` in loop_state.json when the tool wrote into a loop folder."""
    recorded = loop.record(Path(p) for p in written)
    if recorded:
        progress(f"{loop.tool}: recorded {', '.join(recorded)} in {state_path(loop.folder)}")


# --------------------------------------------------------------------------------------------- the loop


def loop_status(req: LoopStatusRequest, progress: Progress = quiet, cancel: Cancel = None) -> LoopStatusResult:
    """Where the optimization loop on a workload stands: each stage done, missing, stale or failed; the next
    stage and the `--from=` value to resume with."""
    return judge_loop(req.workload)


# --------------------------------------------------------------------------------------------- the machine


def preflight(req: PreflightRequest, progress: Progress = quiet, cancel: Cancel = None) -> PreflightResult:
    """GPU, driver, torch/CUDA under the chosen interpreter, nsys, ncu and counter permission."""
    progress(f"preflight: checking this machine and {req.python.python}")
    found = check_machine(req.python.python, quick=req.quick)
    torch_check = next((c for c in found.checks if c.name == "torch"), None)
    version = TORCH_VERSION.match(torch_check.detail) if torch_check is not None and torch_check.detail else None
    return PreflightResult(
        ok=found.ok, checks=found.checks, backend=found.backend, summary=format_report(found),
        interpreter=InterpreterInfo(python=req.python.python, source=req.python.source,
                                    torch_version=version.group(1) if version else None),
    )
