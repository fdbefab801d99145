"""The MCP server: the engine's verbs (`mcp_server.api`) as tools any agent can call (`python -m mcp_server`, stdio).

Each tool is a thin face: its docstring is the description an agent reads, its return type the output schema,
and its body builds the verb's typed request (paths resolved against the client's project, the workload's
interpreter chosen) and hands the verb to `run_engine`, which runs it in a worker thread with progress,
cancellation and a time limit. A parameter named like a field of the verb's request model takes that field's
description (`tool(verb=...)`), and the option groups' parameters are made from their models' fields. Start-up
imports no engine module and no torch: `api` is imported on the first call.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from mcp_server.schema.requests import (
    WINDOW_OPTIONS,
    AnalyzeRequest,
    AssembleRequest,
    BaselineMode,
    BenchRequest,
    CaptureOptions,
    CompareRequest,
    KernelDetailRequest,
    LoopStatusRequest,
    MapRequest,
    MemoryRequest,
    NcuOptions,
    OperatorDetailRequest,
    OptimizeRequest,
    PreflightRequest,
    ProfileRequest,
    RecipesRequest,
    RecipeTiming,
    ReportRequest,
    SummaryRequest,
    TimingOptions,
    ValidateRequest,
)
from mcp_server.schema.results import (
    AnalyzeResult,
    BenchToolResult,
    CompareResult,
    KernelDetail,
    LoopStatusResult,
    MemoryRun,
    OperatorDetail,
    OptimizeResult,
    PreflightResult,
    ProfileRun,
    RecipesResult,
    ReportResult,
    TopOperatorsResult,
    ValidateToolResult,
)
from mcp_server.schema.types import Backend, Tier
from mcp_server.serve.interpreter import choose_python
from mcp_server.serve.paths import project_dir, resolve, resolve_optional, workload_file
from mcp_server.serve.runner import stop_all
from mcp_server.serve.tools import (
    ASSEMBLY_MARGIN_S,
    QUERY_LIMIT_S,
    READ_ONLY,
    REBUILDS,
    REPLACES_COUNTERS,
    RUNS_WORKLOAD,
    Output,
    Positive,
    ProfileRef,
    Python,
    call,
    request,
    server,
    tool,
)
from mcp_server.serve.wording import mcp_words


@tool("Preflight: can this machine profile?", READ_ONLY, verb=PreflightRequest)
async def preflight(ctx: Context, python: Python = None, quick: bool = False) -> PreflightResult:
    """Check the GPU, driver, torch/CUDA under the workload's interpreter, nsys, ncu and counter permission.

    Use first on a new machine, or when profile fails with a backend error: each failed check has a remedy;
    `backend` is what profile's backend='auto' will use. quick=true finds torch without importing it.
    """
    found: PreflightResult = await call(ctx, "preflight", QUERY_LIMIT_S,
                                         lambda: request(PreflightRequest, python=choose_python(python), quick=quick))
    for check in found.checks:
        check.remedy = mcp_words(check.remedy) if check.remedy else check.remedy
    return found.model_copy(update={"summary": mcp_words(found.summary)})


@tool("Profile a workload", RUNS_WORKLOAD, options=CaptureOptions, verb=ProfileRequest)
async def profile(
    workload: str,
    ctx: Context,
    backend: Backend = "auto",
    counters: Annotated[bool, Field(description="Also replay kernels under ncu (slower).")] = False,
    python: Python = None,
    output: Output = None,
    top: int = 10,
    memory: bool = False,
    **capture: Any,
) -> ProfileRun:
    """Run a workload's measured window under a profiler; attribute every kernel to its operator and module.

    Use to find where a PyTorch model spends its time. Writes a run directory (profile.json) and returns the
    window totals and top operators with their operator_ids (drill in with operator_detail).
    """
    options = request(CaptureOptions, **capture)

    def make() -> ProfileRequest:
        from mcp_server.backends.registry import REGISTRY  # imported here: start-up imports no engine module

        named = REGISTRY.get(backend)  # a backend named (not auto) for its counters needs them
        counted = named is not None and named.counters
        return request(ProfileRequest, workload=workload_file(workload), python=choose_python(python),
                        capture=options, backend=backend, ncu=NcuOptions() if counters else None,
                        require_counters=counted, output=resolve_optional(output, "output directory"),
                        project=project_dir(), top=top,
                        memory=memory)

    return await call(ctx, "profile", (3 if memory else 2) * options.timeout_s + ASSEMBLY_MARGIN_S, make)


@tool("Memory: where every byte at the peak comes from", RUNS_WORKLOAD, options=CaptureOptions, only=WINDOW_OPTIONS,
      verb=MemoryRequest)
async def memory(
    target: str, ctx: Context, python: Python = None, output: Output = None, top: int = 10, **capture: Any,
) -> MemoryRun:
    """Record the CUDA caching allocator's history over the window; attribute every block live at the peak to its
    operator, module, phase, line and category (parameter, gradient, optimizer_state, activation, ...).

    Use when a model needs too much GPU memory or runs out of it: peaks, top holders, findings with upper-bound
    savings; an out-of-memory run names what held the memory. Writes memory.json, memory_timeline.png and the
    snapshot. Needs an NVIDIA GPU to capture.
    """
    options = request(CaptureOptions, **capture)
    return await call(ctx, "memory", options.timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        MemoryRequest, target=resolve(target, "workload or run directory"), python=choose_python(python),
        capture=options, output=resolve_optional(output, "output directory"), project=project_dir(), top=top))


@tool("Map: add ncu counters to a run", REPLACES_COUNTERS, name="map", options=NcuOptions, verb=MapRequest)
async def map_counters(
    run_dir: str,
    ctx: Context,
    timeout_s: float = 600.0,
    top: int = 10,
    **ncu: Any,
) -> ProfileRun:
    """Replay an nsys run's window kernels under Nsight Compute; rebuild its profile.json with counters.

    Use after profile(backend='nsys') for hardware evidence (DRAM bytes, occupancy, tensor cores, stalls);
    kernel_regex/launch_count/max_kernels keep it short. Replaces earlier counters. Needs a GPU and ncu.
    """
    return await call(ctx, "map_run", timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        MapRequest, run_dir=resolve(run_dir, "run directory"), ncu=request(NcuOptions, **ncu), timeout_s=timeout_s,
        top=top), "map")


@tool("Assemble profile.json from a run directory", REBUILDS, verb=AssembleRequest)
async def assemble(
    run_dir: str,
    ctx: Context,
    top: int = 10,
) -> ProfileRun:
    """Rebuild a run directory's profile.json from its raw artifacts alone: no GPU and no workload needed.

    Use on a run captured elsewhere (a GPU machine's run copied here), or after upgrading the profiler.
    """
    return await call(ctx, "assemble", ASSEMBLY_MARGIN_S,
                       lambda: request(AssembleRequest, run_dir=resolve(run_dir, "run directory"), top=top))


@tool("Analyze a profile: bottleneck and opportunities", REBUILDS, verb=AnalyzeRequest)
async def analyze(
    profile: ProfileRef,
    ctx: Context,
    output: Output = None,
    measure: bool = True,
) -> AnalyzeResult:
    """Diagnose a profile: the bottleneck and its root cause, a per-stage table, patterns and ranked
    optimization opportunities with Amdahl-bounded estimates and pointers into knowledge/.

    Use right after profile to decide what to change first. Writes analysis.json, trace.json and charts.
    """
    return await call(ctx, "analyze", 2 * ASSEMBLY_MARGIN_S + 600.0, lambda: request(
        AnalyzeRequest, profile=resolve(profile, "profile"), output=resolve_optional(output, "output directory"),
        project=project_dir(), measure=measure))


@tool("Compare two profiles", REBUILDS, verb=CompareRequest)
async def compare(
    baseline: ProfileRef,
    optimized: ProfileRef,
    ctx: Context,
    allow_mismatch: bool = False,
    output: Output = None,
    top: int = 15,
) -> CompareResult:
    """Per-operator, per-module and per-kernel deltas of an optimized profile against its baseline.

    Use after profiling both workloads: which operators got faster, were fused away or appeared. Writes
    comparison.json and .md. Kernel-time sums: the speedup to report comes from bench.
    """
    return await call(ctx, "compare", ASSEMBLY_MARGIN_S, lambda: request(
        CompareRequest, baseline=resolve(baseline, "profile"), optimized=resolve(optimized, "profile"),
        allow_mismatch=allow_mismatch, output=resolve_optional(output, "output directory"), project=project_dir(),
        top=top))


@tool("Bench two workloads, each in its own processes", RUNS_WORKLOAD, options=TimingOptions, verb=BenchRequest)
async def bench(
    baseline: str,
    optimized: str,
    ctx: Context,
    python: Python = None,
    rounds: int = 3,
    baseline_mode: BaselineMode = "eager",
    tier: Tier = "exact",
    recipes: str | None = None,
    output: Output = None,
    timeout_s: float = 600.0,
    **timing: Any,
) -> BenchToolResult:
    """Time two workloads, each in its own processes (rounds alternating): latency and back-to-back speedups, 95% CI.

    baseline_mode: eager (bench.json), a recipe name, or free = the tier's winner in recipes.json (bench_vs_free.json).
    """
    options = request(TimingOptions, **timing)
    return await call(ctx, "bench", 2 * rounds * timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        BenchRequest, baseline=workload_file(baseline, "baseline workload"),
        optimized=workload_file(optimized, "optimized workload"), python=choose_python(python), timing=options,
        rounds=rounds, baseline_mode=baseline_mode, tier=tier, recipes=resolve_optional(recipes, "recipes.json"),
        output=resolve_optional(output, "output directory"), project=project_dir(), timeout_s=timeout_s))


@tool("Recipes: the free frontier of a workload", RUNS_WORKLOAD, options=RecipeTiming, verb=RecipesRequest)
async def recipes(
    workload: str,
    ctx: Context,
    python: Python = None,
    thorough: bool = False,
    only: tuple[str, ...] = (),
    seeds: tuple[int, ...] = (0, 1, 2),
    jobs: int | None = None,
    output: Output = None,
    timeout_s: float = 600.0,
    **timing: Any,
) -> RecipesResult:
    """The free frontier: every few-line recipe (compile modes, TF32, bf16/fp16 autocast or cast, channels_last,
    cuDNN autotuning), each in its own process, validated against fp32 eager into the exact or reduced tier.

    Use before optimizing: each tier's winner (with its code) is what a change must beat. Writes recipes.json.
    """
    options = request(RecipeTiming, **timing)
    return await call(ctx, "recipes", 40 * timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        RecipesRequest, workload=workload_file(workload), python=choose_python(python), timing=options,
        thorough=thorough, only=only, seeds=seeds, jobs=jobs, output=resolve_optional(output, "output directory"),
        project=project_dir(), timeout_s=timeout_s))


@tool("Optimize: the frontier's winner as an optimized workload, proven", RUNS_WORKLOAD, options=TimingOptions,
      verb=OptimizeRequest)
async def optimize(
    workload: str,
    ctx: Context,
    python: Python = None,
    tier: Tier = "exact",
    recipes: str | None = None,
    thorough: bool = False,
    output: Output = None,
    timeout_s: float = 600.0,
    **timing: Any,
) -> OptimizeResult:
    """The floor in one call: profile, the free frontier, the tier's winner written as <name>_optimized.py, bench
    against eager and the winner, validate, profile it, compare, report.md; every file in one folder.

    Use first: what a change must beat. Slow (minutes): every stage runs the workload.
    """
    options = request(TimingOptions, **timing)
    return await call(ctx, "optimize", 60 * timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        OptimizeRequest, workload=workload_file(workload), python=choose_python(python), tier=tier, timing=options,
        recipes=resolve_optional(recipes, "recipes.json"), thorough=thorough,
        output=resolve_optional(output, "output directory"), project=project_dir(), timeout_s=timeout_s))


@tool("Validate an optimized workload", RUNS_WORKLOAD, verb=ValidateRequest)
async def validate(
    baseline: str,
    optimized: str,
    ctx: Context,
    python: Python = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: dict[str, float] | None = None,
    run_tests: bool = True,
    speedup: float | None = None,
    bench_json: str | None = None,
    max_plausible_speedup: float | None = None,
    analysis: str | None = None,
    tier: Tier = "exact",
    optimizations: str | None = None,
    output: Output = None,
    timeout_s: float = 600.0,
) -> ValidateToolResult:
    """Check that an optimized workload computes what the baseline does, and that its speedup is plausible.

    Use before claiming any optimization: same weights, several seeds, dtype-aware tolerances, NaN/Inf,
    mutation, the backend invoked, the generated tests. A failed check is a verdict (passed=false), not an error.
    """
    return await call(ctx, "validate", 2 * timeout_s + ASSEMBLY_MARGIN_S, lambda: request(
        ValidateRequest, baseline=workload_file(baseline, "baseline workload"),
        optimized=workload_file(optimized, "optimized workload"), python=choose_python(python), seeds=seeds,
        rtol=rtol, atol=atol, tolerances=tolerances, run_tests=run_tests, speedup=speedup,
        bench_json=resolve_optional(bench_json, "bench.json"), max_plausible_speedup=max_plausible_speedup,
        analysis=resolve_optional(analysis, "analysis.json"), tier=tier,
        optimizations=resolve_optional(optimizations, "optimizations.json"),
        output=resolve_optional(output, "output directory"), project=project_dir(), timeout_s=timeout_s))


@tool("Report: report.md and OPTIMIZED_WORKLOAD.md", REBUILDS, verb=ReportRequest)
async def report(
    baseline_profile: ProfileRef,
    ctx: Context,
    optimized_profile: str | None = None,
    analysis: str | None = None,
    baseline_analysis: str | None = None,
    comparison: str | None = None,
    bench_json: str | None = None,
    recipes: str | None = None,
    bench_vs_free: str | None = None,
    validation: str | None = None,
    optimizations: str | None = None,
    plan: bool = False,
    output: Output = None,
) -> ReportResult:
    """Write report.md and, given validation, bench or optimizations, OPTIMIZED_WORKLOAD.md.

    Use at the end of a loop with every file the other tools returned: a speedup is stated only from bench.json,
    correctness only from validation_report.json. plan=true writes proposal.md and implementation.md instead.
    """
    return await call(ctx, "report", ASSEMBLY_MARGIN_S, lambda: request(
        ReportRequest, baseline_profile=resolve(baseline_profile, "profile"),
        optimized_profile=resolve_optional(optimized_profile, "profile"),
        analysis=resolve_optional(analysis, "analysis.json"),
        baseline_analysis=resolve_optional(baseline_analysis, "analysis.json"),
        comparison=resolve_optional(comparison, "comparison.json"),
        bench_json=resolve_optional(bench_json, "bench.json"),
        recipes=resolve_optional(recipes, "recipes.json"),
        bench_vs_free=resolve_optional(bench_vs_free, "bench_vs_free.json"),
        validation=resolve_optional(validation, "validation_report.json"),
        optimizations=resolve_optional(optimizations, "optimizations.json"), plan=plan,
        output=resolve_optional(output, "output directory"), project=project_dir()))


@tool("Top operators of a profile", READ_ONLY)
async def top_operators(profile: ProfileRef, ctx: Context, limit: Positive = 10) -> TopOperatorsResult:
    """The operators that take the most time in a profile, grouped by name, with their share and operator_ids.

    Use instead of reading profile.json (megabytes). Pass an operator_id to operator_detail.
    """
    return await call(ctx, "summary", QUERY_LIMIT_S,
                       lambda: request(SummaryRequest, profile=resolve(profile, "profile"), top=limit), "query")


@tool("One operator call in detail", READ_ONLY, verb=OperatorDetailRequest)
async def operator_detail(
    profile: ProfileRef, operator_id: str, ctx: Context, max_kernels: int = 50
) -> OperatorDetail:
    """One operator call (operator_id such as 'aten::linear#3'): module path, shapes, dtypes, fused ops, its
    kernels in launch order and their counters.

    Use after top_operators to see why an operator is slow; kernel_detail has one kernel's every counter.
    """
    return await call(ctx, "operator_detail", QUERY_LIMIT_S, lambda: request(
        OperatorDetailRequest, profile=resolve(profile, "profile"), operator_id=operator_id, max_kernels=max_kernels),
        "query")


@tool("One kernel launch in detail", READ_ONLY)
async def kernel_detail(profile: ProfileRef, kernel_id: int, ctx: Context) -> KernelDetail:
    """One kernel launch (kernel_id = launch order in the window): every metric with its unit, launch
    geometry, its operator and how it was attributed.

    Use for the hardware evidence behind a bottleneck (DRAM bytes, occupancy, tensor cores, stalls).
    """
    return await call(ctx, "kernel_detail", QUERY_LIMIT_S, lambda: request(
        KernelDetailRequest, profile=resolve(profile, "profile"), kernel_id=kernel_id), "query")


@tool("Loop status: which optimization stage is next", READ_ONLY, verb=LoopStatusRequest)
async def loop_status(
    workload: str,
    ctx: Context,
) -> LoopStatusResult:
    """Where the /optimize loop on a workload stands: each stage done, missing, stale or failed, from the
    checkpoint files in its folder (input hashes in loop_state.json, else modification times).

    Use before resuming a loop: resume_from is the stage to start at (--from=), reason says why.
    """
    return await call(ctx, "loop_status", QUERY_LIMIT_S,
                       lambda: request(LoopStatusRequest, workload=workload_file(workload)), "query")


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM, SIGHUP: stop the workloads still running (they live in their own process groups), then exit at once.

    os._exit, because a worker thread blocked reading stdin would keep a normal interpreter exit waiting; any
    child a call did not stop within the grace period is killed first.
    """
    from mcp_server.process.child import stop_children  # imported here: start-up imports no engine module

    stopped = stop_all()
    stop_children()
    print(f"operator-profiler-mcp: terminated; stopped {stopped} running call(s)", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def main() -> None:
    """Serve over stdio (the console script `operator-profiler-mcp` and `python -m mcp_server`)."""
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        print("operator-profiler-mcp: interrupted", file=sys.stderr)
    finally:
        stop_all()


if __name__ == "__main__":
    main()
