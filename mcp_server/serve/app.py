"""The MCP server: the engine's verbs (`mcp_server.api`) as tools any agent can call (`python -m mcp_server`, stdio).

Each tool is a thin face: its docstring is the description an agent reads, its return type the output schema, its
parameters the fields of its verb's request model (`tool`: name, type, bounds, default and description written once,
in `schema/requests.py`; option groups' fields as parameters of their own), and its body builds the verb's typed
request (`face_request`: paths resolved against the client's project, the workload's interpreter chosen) and hands
the verb to `run_engine`, which runs it in a worker thread with progress, cancellation and a time limit. Start-up
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
from mcp_server.serve.runner import stop_all
from mcp_server.serve.tools import (
    ASSEMBLY_MARGIN_S,
    QUERY_LIMIT_S,
    READ_ONLY,
    REBUILDS,
    REPLACES_COUNTERS,
    RUNS_WORKLOAD,
    call,
    face_request,
    options,
    server,
    tool,
)
from mcp_server.serve.wording import mcp_words


@tool("Preflight: can this machine profile?", READ_ONLY, PreflightRequest)
async def preflight(ctx: Context, **values: Any) -> PreflightResult:
    """Check the GPU, driver, torch/CUDA under the workload's interpreter, nsys, ncu and counter permission.

    Use first on a new machine, or when profile fails with a backend error: each failed check has a remedy;
    `backend` is what profile's backend='auto' will use. quick=true finds torch without importing it.
    """
    found: PreflightResult = await call(ctx, "preflight", QUERY_LIMIT_S, lambda: face_request(PreflightRequest, values))
    for check in found.checks:
        check.remedy = mcp_words(check.remedy) if check.remedy else check.remedy
    return found.model_copy(update={"summary": mcp_words(found.summary)})


@tool("Profile a workload", RUNS_WORKLOAD, ProfileRequest, groups={"capture": None}, hidden=("ncu", "require_counters"))
async def profile(
    ctx: Context,
    counters: Annotated[bool, Field(description="Also replay kernels under ncu (slower).")] = False,
    **values: Any,
) -> ProfileRun:
    """Run a workload's measured window under a profiler; attribute every kernel to its operator and module.

    Use to find where a PyTorch model spends its time. Writes a run directory (profile.json); returns the window
    totals and top operators with their operator_ids (drill in with operator_detail).
    """
    capture = options(CaptureOptions, values)

    def make() -> ProfileRequest:
        from mcp_server.backends.registry import REGISTRY  # imported here: start-up imports no engine module

        named = REGISTRY.get(values["backend"])  # a backend named (not auto) for its counters needs them
        return face_request(ProfileRequest, values, capture=capture, ncu=NcuOptions() if counters else None,
                            require_counters=named is not None and named.counters)

    return await call(ctx, "profile", (3 if values["memory"] else 2) * capture.timeout_s + ASSEMBLY_MARGIN_S, make)


@tool("Memory: where every byte at the peak comes from", RUNS_WORKLOAD, MemoryRequest,
      groups={"capture": WINDOW_OPTIONS})
async def memory(ctx: Context, **values: Any) -> MemoryRun:
    """Record the CUDA caching allocator's history over the window; attribute every block live at the peak to its
    operator, module, phase, line and category (parameter, gradient, optimizer_state, activation, ...).

    Use when a model needs too much GPU memory or runs out of it: peaks, top holders, findings with upper-bound
    savings; an OOM run names what held it. Writes memory.json, memory_timeline.png, the snapshot.
    Needs an NVIDIA GPU.
    """
    capture = options(CaptureOptions, values)
    return await call(ctx, "memory", capture.timeout_s + ASSEMBLY_MARGIN_S,
                      lambda: face_request(MemoryRequest, values, capture=capture))


@tool("Map: add ncu counters to a run", REPLACES_COUNTERS, MapRequest, name="map", groups={"ncu": None})
async def map_counters(ctx: Context, **values: Any) -> ProfileRun:
    """Replay an nsys run's window kernels under Nsight Compute; rebuild its profile.json with counters.

    Use after profile(backend='nsys') for hardware evidence (DRAM bytes, occupancy, tensor cores, stalls);
    kernel_regex/launch_count/max_kernels keep it short. Replaces earlier counters. Needs a GPU and ncu.
    """
    return await call(ctx, "map_run", values["timeout_s"] + ASSEMBLY_MARGIN_S,
                      lambda: face_request(MapRequest, values), "map")


@tool("Assemble profile.json from a run directory", REBUILDS, AssembleRequest)
async def assemble(ctx: Context, **values: Any) -> ProfileRun:
    """Rebuild a run directory's profile.json from its raw artifacts alone: no GPU and no workload needed.

    Use on a run captured elsewhere (a GPU machine's run copied here), or after upgrading the profiler.
    """
    return await call(ctx, "assemble", ASSEMBLY_MARGIN_S, lambda: face_request(AssembleRequest, values))


@tool("Analyze a profile: bottleneck and opportunities", REBUILDS, AnalyzeRequest)
async def analyze(ctx: Context, **values: Any) -> AnalyzeResult:
    """Diagnose a profile: the bottleneck and its root cause, a per-stage table, patterns and ranked
    optimization opportunities with Amdahl-bounded estimates and pointers into knowledge/.

    Use right after profile to decide what to change first. Writes analysis.json, trace.json and charts.
    """
    return await call(ctx, "analyze", 2 * ASSEMBLY_MARGIN_S + 600.0, lambda: face_request(AnalyzeRequest, values))


@tool("Compare two profiles", REBUILDS, CompareRequest)
async def compare(ctx: Context, **values: Any) -> CompareResult:
    """Per-operator, per-module and per-kernel deltas of an optimized profile against its baseline.

    Use after profiling both workloads: which operators got faster, were fused away or appeared. Writes
    comparison.json and .md. Kernel-time sums: the speedup to report comes from bench.
    """
    return await call(ctx, "compare", ASSEMBLY_MARGIN_S, lambda: face_request(CompareRequest, values))


@tool("Bench two workloads", RUNS_WORKLOAD, BenchRequest, groups={"timing": None})
async def bench(ctx: Context, **values: Any) -> BenchToolResult:
    """Time two workloads, each in its own processes, in turns: latency and back-to-back speedups, 95% CI.

    Writes bench.json against eager, bench_vs_free.json against the tier's winner.
    """
    timing = options(TimingOptions, values)
    return await call(ctx, "bench", 2 * values["rounds"] * values["timeout_s"] + ASSEMBLY_MARGIN_S,
                      lambda: face_request(BenchRequest, values, timing=timing))


@tool("Recipes: the free frontier of a workload", RUNS_WORKLOAD, RecipesRequest, groups={"timing": None})
async def recipes(ctx: Context, **values: Any) -> RecipesResult:
    """The free frontier: every few-line recipe (compile modes, TF32, bf16/fp16 autocast or cast, channels_last,
    cuDNN autotuning), each in its own process, validated against eager as written into the exact, reduced or fp8 tier.

    Use before optimizing: each tier's winner (with its code) is what to beat. Writes recipes.json.
    """
    timing = options(RecipeTiming, values)
    return await call(ctx, "recipes", 40 * values["timeout_s"] + ASSEMBLY_MARGIN_S,
                      lambda: face_request(RecipesRequest, values, timing=timing))


@tool("Optimize: the frontier's winner as an optimized workload, proven", RUNS_WORKLOAD, OptimizeRequest,
      groups={"timing": None})
async def optimize(ctx: Context, **values: Any) -> OptimizeResult:
    """The floor in one call: profile, the free frontier, the tier's winner written as <name>_optimized.py, bench
    against eager and the winner, validate, profile it, compare, report.md; every file in one folder.

    Use first: what a change must beat. Slow (minutes): every stage runs the workload.
    """
    timing = options(TimingOptions, values)
    return await call(ctx, "optimize", 60 * values["timeout_s"] + ASSEMBLY_MARGIN_S,
                      lambda: face_request(OptimizeRequest, values, timing=timing))


@tool("Validate an optimized workload", RUNS_WORKLOAD, ValidateRequest)
async def validate(ctx: Context, **values: Any) -> ValidateToolResult:
    """Check that an optimized workload computes what the baseline does, and that its speedup is plausible.

    Use before claiming any optimization: same weights, several seeds, dtype-aware tolerances, NaN/Inf,
    mutation, the backend invoked, the generated tests. A failed check is a verdict (passed=false), not an error.
    """
    return await call(ctx, "validate", 2 * values["timeout_s"] + ASSEMBLY_MARGIN_S,
                      lambda: face_request(ValidateRequest, values))


@tool("Report: report.md and OPTIMIZED_WORKLOAD.md", REBUILDS, ReportRequest)
async def report(ctx: Context, **values: Any) -> ReportResult:
    """Write report.md and, given validation, bench or optimizations, OPTIMIZED_WORKLOAD.md.

    Use at the end of a loop with every file the other tools returned: a speedup is stated only from bench.json,
    correctness only from validation_report.json. plan=true writes proposal.md and implementation.md instead.
    """
    return await call(ctx, "report", ASSEMBLY_MARGIN_S, lambda: face_request(ReportRequest, values))


@tool("Top operators of a profile", READ_ONLY, SummaryRequest, renamed={"top": "limit"})
async def top_operators(ctx: Context, **values: Any) -> TopOperatorsResult:
    """The operators that take the most time in a profile, grouped by name, with their share and operator_ids.

    Use instead of reading profile.json (megabytes). Pass an operator_id to operator_detail.
    """
    return await call(ctx, "summary", QUERY_LIMIT_S, lambda: face_request(SummaryRequest, values), "query")


@tool("One operator call in detail", READ_ONLY, OperatorDetailRequest)
async def operator_detail(ctx: Context, **values: Any) -> OperatorDetail:
    """One operator call (operator_id such as 'aten::linear#3'): module path, shapes, dtypes, fused ops, its
    kernels in launch order and their counters.

    Use after top_operators to see why an operator is slow; kernel_detail has one kernel's every counter.
    """
    return await call(ctx, "operator_detail", QUERY_LIMIT_S, lambda: face_request(OperatorDetailRequest, values),
                      "query")


@tool("One kernel launch in detail", READ_ONLY, KernelDetailRequest)
async def kernel_detail(ctx: Context, **values: Any) -> KernelDetail:
    """One kernel launch (kernel_id = launch order in the window): every metric with its unit, launch
    geometry, its operator and how it was attributed.

    Use for the hardware evidence behind a bottleneck (DRAM bytes, occupancy, tensor cores, stalls).
    """
    return await call(ctx, "kernel_detail", QUERY_LIMIT_S, lambda: face_request(KernelDetailRequest, values), "query")


@tool("Loop status: which optimization stage is next", READ_ONLY, LoopStatusRequest)
async def loop_status(ctx: Context, **values: Any) -> LoopStatusResult:
    """Where the /optimize loop on a workload stands: each stage done, missing, stale or failed, from the
    checkpoint files in its folder (input hashes in loop_state.json, else modification times).

    Use before resuming a loop: resume_from is the stage to start at (--from=), reason says why.
    """
    return await call(ctx, "loop_status", QUERY_LIMIT_S, lambda: face_request(LoopStatusRequest, values), "query")


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
