"""The MCP server: the profiler's pipeline as tools any agent can call (`python -m mcp_server`, stdio).

Each tool is a thin wrapper: its docstring is the description an agent reads, its return type the output
schema, and its body hands a blocking engine call (tools/actions.py, the same functions the CLI calls) to
`run_engine`, which runs it in a worker thread with progress, cancellation and a time limit. Start-up
imports no engine module and no torch: `actions` is imported on the first long call.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from pydantic import Field

from mcp_server import __version__
from mcp_server.schema.tools import (
    AnalyzeResult,
    BenchToolResult,
    CompareResult,
    KernelDetail,
    OperatorDetail,
    PreflightResult,
    ProfileRun,
    ReportResult,
    TopOperatorsResult,
    ValidateToolResult,
)
from mcp_server.tools import queries
from mcp_server.tools.paths import profile_file
from mcp_server.tools.runner import run_engine, stop_all

INSTRUCTIONS = """\
Operator Profiler attributes every CUDA kernel of a PyTorch workload to the operator (aten::linear, an
Inductor-fused group) and nn.Module path that launched it, and proves optimizations with evidence.
A workload is a .py file defining get_model_and_input() -> (model, inputs).
Flow: preflight -> profile -> analyze -> top_operators / operator_detail / kernel_detail -> write an
optimized copy -> validate (is it still right?) -> bench (how much faster, with a confidence interval) ->
profile the optimized workload -> compare (which operators moved) -> report.
Relative paths resolve against the project directory (CLAUDE_PROJECT_DIR, else the server's working
directory); every run writes into its own folder under <project>/op_runs/. Workloads run under the
project's interpreter: the python argument, else $OPERATOR_PROFILER_PYTHON, else <project>/.venv/bin/python,
else python3 on PATH; every result says which interpreter and which torch ran.
"""

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
RUNS_WORKLOAD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                open_world_hint=False)
REBUILDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
REPLACES_COUNTERS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                    open_world_hint=False)
QUERY_LIMIT_S = 120.0
ASSEMBLY_MARGIN_S = 300.0

Python = Annotated[str | None, Field(description="Interpreter that runs the workload (default: see instructions).")]
Output = Annotated[str | None, Field(description="Folder to write into (default: a fresh one under op_runs/).")]
TimeoutS = Annotated[float, Field(gt=0, description="Seconds each child process may run before it is stopped.")]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[int, Field(ge=1)]
ProfileRef = Annotated[str, Field(description="A profile.json, or the run directory holding it.")]
Backend = Literal["auto", "torch", "nsys"]
CompileMode = Literal["eager", "inductor", "cudagraphs", "optimized"]
Tolerances = Annotated[dict[str, float] | None, Field(description="rtol per dtype class, e.g. {'bfloat16': 2e-2}.")]

F = TypeVar("F", bound=Callable[..., Any])

server = MCPServer(name="operator-profiler", version=__version__, instructions=INSTRUCTIONS)


def tool(title: str, annotations: ToolAnnotations, name: str | None = None) -> Callable[[F], F]:
    """Register a tool whose description is its docstring, dedented."""

    def register(fn: F) -> F:
        server.add_tool(fn, name=name, title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                        annotations=annotations)
        return fn

    return register


def _actions() -> ModuleType:
    """The engine-facing tool bodies, imported on first use so that start-up stays light."""
    from mcp_server.tools import actions

    return actions


@tool("Preflight: can this machine profile?", READ_ONLY)
async def preflight(ctx: Context, python: Python = None, quick: bool = False) -> PreflightResult:
    """Check the GPU, driver, torch/CUDA under the workload's interpreter, nsys, ncu and counter permission.

    Use first on a new machine or when profile fails with a backend error: each failed check has a remedy,
    and `backend` says what profile with backend='auto' will use ('nsys' = nsys + ncu, 'torch' =
    torch.profiler, CPU operator times when no GPU is visible). quick=true skips starting the interpreter.
    """
    work = partial(_actions().preflight_run, python=python, quick=quick)
    return await run_engine(ctx, "preflight", work, QUERY_LIMIT_S)


@tool("Profile a workload", RUNS_WORKLOAD)
async def profile(
    workload: Annotated[str, Field(description="The .py file defining get_model_and_input().")],
    ctx: Context,
    backend: Backend = "auto",
    counters: Annotated[bool, Field(description="With nsys, also replay kernels under ncu (slower).")] = False,
    compile_mode: CompileMode = "eager",
    warmup_iters: Count = 3,
    iters: Positive = 1,
    seed: int = 0,
    train_step: Annotated[bool, Field(description="Profile the workload's train_step(model, inputs).")] = False,
    python: Python = None,
    output: Output = None,
    timeout_s: TimeoutS = 600.0,
    top: Positive = 10,
) -> ProfileRun:
    """Run a workload's measured window under a profiler and attribute every kernel to its operator and module.

    Use this to find out where a PyTorch model spends its time. Writes a run directory (raw artifacts,
    manifest.json, profile.json) and returns the window totals and the top operators with their operator_ids;
    drill in with operator_detail / kernel_detail. backend 'auto' uses nsys when an NVIDIA GPU with nsys and
    ncu is present, else torch.profiler (on a CPU-only machine: CPU operator times, said plainly).
    counters=true adds ncu hardware counters in the same call; `map` adds them to an existing nsys run.
    """
    work = partial(_actions().profile_workload, workload=workload, backend=backend, counters=counters,
                   compile_mode=compile_mode, warmup_iters=warmup_iters, iters=iters, seed=seed,
                   train_step=train_step, python=python, output=output, timeout_s=timeout_s, top=top)
    return await run_engine(ctx, "profile", work, 2 * timeout_s + ASSEMBLY_MARGIN_S)


@tool("Map: add ncu counters to a run", REPLACES_COUNTERS, name="map")
async def map_counters(
    run_dir: Annotated[str, Field(description="A run directory captured with backend 'nsys'.")],
    ctx: Context,
    kernel_regex: Annotated[
        str | None, Field(description="Replay only kernels whose mangled name matches (a Triton kernel's is its name).")
    ] = None,
    launch_skip: Count | None = None,
    launch_count: Count | None = None,
    max_kernels: Annotated[
        int | None, Field(ge=1, description="Stop ncu once it replayed this many kernels (the first distinct ones).")
    ] = None,
    dedupe: Annotated[bool, Field(description="Replay each unique name+grid+block once, copy counters.")] = True,
    metric_set: Annotated[str | None, Field(description="Also collect an ncu section set, e.g. 'full'.")] = None,
    sections: Annotated[tuple[str, ...], Field(description="Also collect these ncu sections.")] = (),
    ncu_sudo: Annotated[bool, Field(description="Run ncu through `sudo -n` (never prompts).")] = False,
    timeout_s: TimeoutS = 600.0,
    top: Positive = 10,
) -> ProfileRun:
    """Replay the window's kernels of an nsys run under Nsight Compute and rebuild its profile.json with counters.

    Use after profile(backend='nsys') when you need hardware evidence (DRAM bytes, occupancy, tensor-core
    use, stalls) for the operators that matter; kernel_regex/launch_count/max_kernels keep the replay short. Replaces
    the run's previous ncu counters. Needs a GPU, ncu and counter permission (see preflight).
    """
    work = partial(_actions().map_run, run_dir=run_dir, kernel_regex=kernel_regex, launch_skip=launch_skip,
                   launch_count=launch_count, max_kernels=max_kernels, dedupe=dedupe, metric_set=metric_set,
                   sections=sections, ncu_sudo=ncu_sudo, timeout_s=timeout_s, top=top)
    return await run_engine(ctx, "map", work, timeout_s + ASSEMBLY_MARGIN_S)


@tool("Assemble profile.json from a run directory", REBUILDS)
async def assemble(
    run_dir: Annotated[str, Field(description="A run directory (holding manifest.json).")],
    ctx: Context,
    top: Positive = 10,
) -> ProfileRun:
    """Rebuild a run directory's profile.json from its raw artifacts alone: no GPU and no workload needed.

    Use on a run captured elsewhere (e.g. a GPU machine's run copied here), or after upgrading the profiler,
    then query it with top_operators / operator_detail / kernel_detail.
    """
    work = partial(_actions().assemble_run, run_dir=run_dir, top=top)
    return await run_engine(ctx, "assemble", work, ASSEMBLY_MARGIN_S)


@tool("Analyze a profile: bottleneck and opportunities", REBUILDS)
async def analyze(
    profile: ProfileRef,
    ctx: Context,
    output: Output = None,
    measure: Annotated[bool, Field(description="Microbenchmark a GPU missing from the device table.")] = True,
) -> AnalyzeResult:
    """Diagnose a profile: the window's bottleneck with its root cause, a per-stage table (share, tensor-core
    use, DRAM, occupancy, bottleneck class), detected patterns and ranked optimization opportunities with
    Amdahl-bounded estimates and pointers into knowledge/.

    Use right after profile (or map) to decide what to change first. Writes analysis.json, trace.json
    (open in Perfetto) and roofline/time charts. CPU-only profiles get CPU hotspots instead.
    """
    work = partial(_actions().analyze_run, profile=profile, output=output, measure=measure)
    return await run_engine(ctx, "analyze", work, 2 * ASSEMBLY_MARGIN_S + 600.0)


@tool("Compare two profiles", REBUILDS)
async def compare(
    baseline: ProfileRef,
    optimized: ProfileRef,
    ctx: Context,
    allow_mismatch: Annotated[bool, Field(description="Compare different devices or input shapes anyway.")] = False,
    output: Output = None,
    top: Positive = 15,
) -> CompareResult:
    """Per-operator, per-module and per-kernel deltas of an optimized profile against its baseline.

    Use after profiling both workloads to see which operators got faster, which were fused away and which
    appeared (new casts, replacements). Writes comparison.json and comparison.md. These are kernel-time
    sums; the speedup to report comes from bench.
    """
    work = partial(_actions().compare_run, baseline=baseline, optimized=optimized, allow_mismatch=allow_mismatch,
                   output=output, top=top)
    return await run_engine(ctx, "compare", work, ASSEMBLY_MARGIN_S)


@tool("Bench: is the optimized workload faster?", RUNS_WORKLOAD)
async def bench(
    baseline: Annotated[str, Field(description="The baseline workload .py file.")],
    optimized: Annotated[str, Field(description="The optimized workload .py file.")],
    ctx: Context,
    python: Python = None,
    warmup: Positive = 5,
    reps: Annotated[int, Field(ge=1, description="Timed calls per side per round.")] = 20,
    rounds: Annotated[int, Field(ge=1, description="Interleaved rounds, alternating which side goes first.")] = 6,
    input_sets: Positive = 4,
    seed: int = 0,
    baseline_mode: Literal["eager", "inductor"] = "eager",
    output: Output = None,
    timeout_s: TimeoutS = 600.0,
) -> BenchToolResult:
    """Time two workloads interleaved in one process; the speedup with a 95% bootstrap confidence interval.

    Use to measure an optimization's real effect (wall-clock per call, CUDA events on a GPU), not kernel-time
    sums. `speedup.significant` is false when the interval contains 1.0. Writes bench.json, whose path
    validate accepts as bench_json for its plausibility check.
    """
    work = partial(_actions().bench_run, baseline=baseline, optimized=optimized, python=python, warmup=warmup,
                   reps=reps, rounds=rounds, input_sets=input_sets, seed=seed, baseline_mode=baseline_mode,
                   output=output, timeout_s=timeout_s)
    return await run_engine(ctx, "bench", work, timeout_s + ASSEMBLY_MARGIN_S)


@tool("Validate an optimized workload", RUNS_WORKLOAD)
async def validate(
    baseline: Annotated[str, Field(description="The baseline workload .py file.")],
    optimized: Annotated[str, Field(description="The optimized workload .py file.")],
    ctx: Context,
    python: Python = None,
    seeds: Annotated[tuple[int, ...], Field(min_length=1, description="Seeds for fresh inputs.")] = (0, 1, 2),
    rtol: Annotated[float | None, Field(ge=0, description="Relative tolerance for every dtype.")] = None,
    atol: Annotated[float | None, Field(ge=0, description="Absolute tolerance for every dtype.")] = None,
    tolerances: Tolerances = None,
    run_tests: Annotated[bool, Field(description="Run the generated test_<name>.py beside it.")] = True,
    speedup: Annotated[float | None, Field(description="Measured speedup to check for plausibility.")] = None,
    bench_json: Annotated[str | None, Field(description="A bench.json whose speedup to check instead.")] = None,
    max_plausible_speedup: Annotated[float | None, Field(ge=0, description="Roofline bound on speedup.")] = None,
    output: Output = None,
    timeout_s: TimeoutS = 600.0,
) -> ValidateToolResult:
    """Check that an optimized workload computes what the baseline does, and that its speedup is plausible.

    Use before claiming any optimization: both models on the baseline's weights, several seeds, dtype-aware
    tolerances, NaN/Inf, input mutation, cached outputs, the registered backend actually invoked, the generated
    tests. A failed check is a verdict (passed=false, failed_checks), not an error. Writes validation_report.json.
    """
    work = partial(_actions().validate_run, baseline=baseline, optimized=optimized, python=python, seeds=seeds,
                   rtol=rtol, atol=atol, tolerances=tolerances, run_tests=run_tests, speedup=speedup,
                   bench_json=bench_json, max_plausible_speedup=max_plausible_speedup, output=output,
                   timeout_s=timeout_s)
    return await run_engine(ctx, "validate", work, 2 * timeout_s + ASSEMBLY_MARGIN_S)


@tool("Report: report.md and OPTIMIZED_WORKLOAD.md", REBUILDS)
async def report(
    baseline_profile: ProfileRef,
    ctx: Context,
    optimized_profile: Annotated[str | None, Field(description="The optimized workload's profile.")] = None,
    analysis: Annotated[str | None, Field(
        description="analysis.json (from analyze): the optimized profile's for a report, the baseline's for a plan."
    )] = None,
    comparison: Annotated[str | None, Field(description="comparison.json (from compare).")] = None,
    bench_json: Annotated[str | None, Field(description="bench.json (from bench): the only speedup stated.")] = None,
    validation: Annotated[str | None, Field(description="validation_report.json (from validate).")] = None,
    optimizations: Annotated[str | None, Field(description="optimizations.json of the changes made.")] = None,
    plan: Annotated[bool, Field(
        description="Plan mode: validate optimizations.json against its schema and write proposal.md and "
        "implementation.md from the baseline profile (and its analysis) instead of the report."
    )] = False,
    output: Output = None,
) -> ReportResult:
    """Write report.md (device and clocks, per-operator before/after, the evidence) and, when validation, bench
    or optimizations are given, OPTIMIZED_WORKLOAD.md.

    Use at the end of an optimization loop, passing every file the other tools returned. A speedup is stated
    only from bench.json, and correctness only from validation_report.json; the report says so when missing.
    With plan=true (after the strategist wrote optimizations.json), it validates that file and writes
    proposal.md and implementation.md instead.
    """
    work = partial(_actions().report_run, baseline_profile=baseline_profile, optimized_profile=optimized_profile,
                   analysis=analysis, comparison=comparison, bench_json=bench_json, validation=validation,
                   optimizations=optimizations, plan=plan, output=output)
    return await run_engine(ctx, "report", work, ASSEMBLY_MARGIN_S)


@tool("Top operators of a profile", READ_ONLY)
async def top_operators(profile: ProfileRef, ctx: Context, limit: Positive = 10) -> TopOperatorsResult:
    """The operators that take the most time in a profile, grouped by name, with their share and operator_ids.

    Use instead of reading profile.json (it can be megabytes): ranks by GPU kernel time, or by CPU time in a
    CPU-only profile. Pass an operator_id to operator_detail to see its kernels and counters.
    """
    return await run_engine(
        ctx, "query", lambda _p, _c: queries.top_operators_result(profile_file(profile), limit), QUERY_LIMIT_S
    )


@tool("One operator call in detail", READ_ONLY)
async def operator_detail(
    profile: ProfileRef, operator_id: str, ctx: Context, max_kernels: Count = 50
) -> OperatorDetail:
    """One operator call (operator_id such as 'aten::linear#3'): module path, shapes, dtypes, fused ops, its
    kernels grouped by name and listed in launch order, and the counters ncu measured on them.

    Use after top_operators to understand why an operator is slow; pass a kernel_id to kernel_detail for all
    of one kernel's counters.
    """
    return await run_engine(
        ctx, "query", lambda _p, _c: queries.operator_detail(profile_file(profile), operator_id, max_kernels),
        QUERY_LIMIT_S,
    )


@tool("One kernel launch in detail", READ_ONLY)
async def kernel_detail(profile: ProfileRef, kernel_id: int, ctx: Context) -> KernelDetail:
    """One kernel launch (kernel_id = launch order in the window) with every metric and its unit, launch
    geometry, how it was attributed and to which operator, and which identical launches share its counters.

    Use for the hardware evidence behind a bottleneck (DRAM bytes, occupancy, tensor-core activity, stalls).
    """
    return await run_engine(
        ctx, "query", lambda _p, _c: queries.kernel_detail(profile_file(profile), kernel_id), QUERY_LIMIT_S
    )


def _terminate(signum: int, _frame: object) -> None:
    """SIGTERM: stop the workloads still running (they live in their own process groups), then exit at once.

    os._exit, because a worker thread blocked reading stdin would keep a normal interpreter exit waiting.
    """
    stopped = stop_all()
    print(f"operator-profiler-mcp: terminated; stopped {stopped} running call(s)", file=sys.stderr, flush=True)
    os._exit(128 + signum)


def main() -> None:
    """Serve over stdio (the console script `operator-profiler-mcp` and `python -m mcp_server`)."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        server.run("stdio")
    except KeyboardInterrupt:
        print("operator-profiler-mcp: interrupted", file=sys.stderr)
    finally:
        stop_all()


if __name__ == "__main__":
    main()
