"""Pydantic models of what the facade's verbs return: the MCP tools' structured content and output schemas, and
what the CLI prints.

Every result names the files the tool wrote (absolute paths) and, where a workload ran, which interpreter
and which torch ran it. Results are digests an agent can read in one go; the full data stays in the files
(profile.json, comparison.json, bench.json, validation_report.json) whose paths they give.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from mcp_server.schema.analysis import (
    Configuration,
    CpuHotspot,
    Diagnosis,
    DistributedAnalysis,
    Finding,
    Opportunity,
    SpeedOfLight,
    StageRow,
    TimelineHealth,
)
from mcp_server.schema.profile import AggregatedMetrics, KernelRecord, WindowTotals
from mcp_server.schema.proof import (
    CheckResult,
    Metric,
    OperatorDelta,
    ProfileSummary,
    SpeedupEstimate,
    TimingSummary,
    TotalDelta,
)
from mcp_server.schema.ranks import RanksSummary
from mcp_server.schema.recipes import SkippedRecipes, Winner
from mcp_server.schema.types import CaptureBackend, CompileMode, LoopTool, Provenance, RunMode, StageName, StageStatus


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OperatorSummary(BaseModel):
    """One operator name (all its calls) in the window."""

    operator_name: str
    module_paths: list[str]
    calls: int
    kernels: int
    gpu_time_ns: int
    cpu_total_time_ns: int | None = None
    cpu_self_time_ns: int | None = None
    share_pct: float = Field(description="Share of the window's kernel time; in a CPU-only profile, of the "
                             "operators' CPU total time (not of the window: see the profile's warnings).")
    is_fused: bool
    phases: list[str] = Field(default_factory=list, description="Phases its calls ran in (forward, backward, "
                              "optimizer).")
    call_sites: list[str] = Field(default_factory=list, description="The user's lines that called it, heaviest "
                                  "first (at most 3).")


class ModulePhaseTime(_Model):
    """Kernel time of one module in one phase: e.g. `layers.2.self_attn` backward 0.81 ms."""

    module_path: str | None = Field(description="None: work no module is known for (e.g. a loss outside the model).")
    phase: str | None
    kernel_time_ns: int
    share_pct: float = Field(description="Share of the window's kernel time.")
    operator_calls: int


class InterpreterInfo(_Model):
    """Which Python ran the workload, why that one, and which torch it had."""

    python: str = Field(description="The interpreter the server started (as chosen, before symlinks).")
    source: str = Field(
        description="Why this one: 'argument' (the tool's python argument), 'OPERATOR_PROFILER_PYTHON', "
        "'project .venv' (<project>/.venv/bin/python), 'PATH' (python3 on PATH) or 'manifest' (the run's own)."
    )
    executable: str | None = Field(default=None, description="sys.executable as the workload's process saw it.")
    torch_version: str | None = Field(default=None, description="torch.__version__ in that process.")


class ProfileHeader(_Model):
    """Where and how a profile was captured."""

    profile_path: str
    workload: str
    tool: str = Field(description="'torch_profiler' or 'nsys+ncu'.")
    device_type: str
    device_name: str | None = None
    gpu_used: bool
    compile_mode: CompileMode
    run_mode: RunMode
    iters: int
    torch_version: str
    python_executable: str


class TopOperator(OperatorSummary):
    """One operator name ranked by time, with the ids of its calls for operator_detail."""

    operator_ids: list[str] = Field(
        default_factory=list, description="operator_id of its calls, heaviest first (at most 10)."
    )


class ProfileRun(_Model):
    """What `profile`, `map` and `assemble` return: the run directory, its profile and a digest of it."""

    run_dir: str
    profile_path: str
    manifest_path: str
    files: list[str] = Field(description="Files of the run: manifest, raw artifacts of every pass, profile.json.")
    backend: CaptureBackend = Field(description="What captured it: 'torch' (torch.profiler) or 'nsys+ncu'.")
    backend_note: str = Field(description="Why this backend, and what it means for the numbers.")
    interpreter: InterpreterInfo
    profile: ProfileHeader
    window: WindowTotals
    top_operators: list[TopOperator]
    unattributed_kernel_count: int
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    ranks_path: str | None = Field(
        default=None, description="A multi-rank run: ranks.json (its merged view); `profile` is then the first "
        "rank's, and every rank's lies in rank<R>/profile.json.")
    ranks: RanksSummary | None = Field(default=None, description="A multi-rank run: ranks.json's content.")
    memory_path: str | None = Field(default=None, description="memory.json, when the run has a memory pass.")


class TopOperatorsResult(_Model):
    """The heaviest operators of a profile."""

    profile: ProfileHeader
    time_basis: str = Field(description="'gpu_kernel_time' (sum of kernel durations) or 'cpu_total_time'.")
    window: WindowTotals
    operator_names: int = Field(description="Distinct operator names in the window.")
    operators: list[TopOperator]
    modules_by_phase: list[ModulePhaseTime] = Field(
        default_factory=list, description="Kernel time per module and phase, heaviest first (GPU profiles)."
    )
    memory: str | None = Field(default=None, description="The memory section, when memory.json lies beside the "
                               "profile: peaks, holders at the peak, findings.")


class KernelBrief(_Model):
    """One kernel launch, without its counters (kernel_detail has them)."""

    kernel_id: int
    kernel_name: str
    start_ns: int
    duration_ns: int
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    stream_id: int | None = None
    module_path: str | None = None
    attribution: str = Field(description="'<method>/<confidence>', e.g. 'kineto_correlation/high'.")
    launch_op: str | None = None
    metric_count: int = Field(description="How many counters kernel_detail will show.")
    propagated_from: int | None = None


class KernelNameTotal(_Model):
    """Launches and time of one kernel name within an operator."""

    kernel_name: str
    launches: int
    total_duration_ns: int


class OperatorDetail(_Model):
    """One operator call: identity, shapes, rolled-up counters and its kernels."""

    profile: ProfileHeader
    operator_id: str
    operator_name: str
    call_index: int
    module_path: str | None = None
    input_shapes: list[list[int] | None] | None = None
    input_dtypes: list[str | None] | None = None
    is_fused: bool
    fused_operators: list[str] = Field(default_factory=list)
    phase: str | None = None
    call_site: str | None = Field(default=None, description="`path:line` of the user's code that made the call.")
    autograd_node: str | None = None
    forward_op: str | None = Field(default=None, description="The forward op a backward call differentiates.")
    share_pct: float = Field(description="Share of the window's kernel time (of the operators' CPU total time in "
                             "CPU-only profiles).")
    aggregated: AggregatedMetrics
    kernel_count: int
    kernel_names: list[KernelNameTotal] = Field(description="Its kernels grouped by name, heaviest first.")
    kernels: list[KernelBrief] = Field(description="Its kernel launches in launch order (up to max_kernels).")
    kernels_truncated: bool
    counter_names: list[str] = Field(description="Counters present on its kernels (ncu metric names).")


class KernelDetail(_Model):
    """One kernel launch with every counter, and the operator it is attributed to."""

    profile: ProfileHeader
    kernel: KernelRecord
    operator_id: str | None = Field(default=None, description="None when the kernel is unattributed.")
    operator_name: str | None = None
    share_pct: float = Field(description="Share of the window's kernel time.")
    propagated_to: list[int] = Field(
        default_factory=list, description="Identical launches that received this kernel's replayed counters."
    )


class AnalyzeResult(_Model):
    """The diagnosis of one profile: bottleneck, per-stage table, ranked opportunities, findings."""

    analysis_path: str
    out_dir: str
    files: list[str] = Field(description="analysis.json, trace.json and charts (when matplotlib is installed).")
    summary: str = Field(description="The diagnosis as the CLI prints it.")
    profile: ProfileHeader
    configuration: Configuration
    gpu_data: bool
    counters: bool
    diagnosis: Diagnosis
    stages: list[StageRow]
    opportunities: list[Opportunity] = Field(description="Ranked changes, each with evidence and an estimate.")
    findings: list[Finding]
    cpu_hotspots: list[CpuHotspot] = Field(default_factory=list)
    speed_of_light: SpeedOfLight | None = None
    timeline: TimelineHealth | None = None
    distributed: DistributedAnalysis | None = None
    notes: list[str] = Field(default_factory=list)


class CompareResult(_Model):
    """An optimized profile against its baseline: headline, totals and the operators that moved most."""

    comparison_path: str
    markdown_path: str
    files: list[str]
    summary: str
    time_basis: str
    baseline: ProfileSummary
    optimized: ProfileSummary
    totals: list[TotalDelta]
    match_counts: dict[str, int]
    operator_deltas: list[OperatorDelta] = Field(description="Largest |time delta| first (up to top).")
    operator_delta_count: int
    new_casts: list[str] = Field(default_factory=list)
    mismatches: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)


class ReportResult(_Model):
    """The documents `report` wrote."""

    report_path: str
    optimized_workload_path: str | None = Field(
        default=None, description="OPTIMIZED_WORKLOAD.md, written when validation, bench or optimizations were given."
    )
    out_dir: str
    files: list[str]


class BenchSideSummary(_Model):
    """One side of a bench: how it ran and its per-call statistics by each metric."""

    workload: str
    how_run: str
    recipe: str | None = None
    first_call_ns: int
    latency: TimingSummary
    back_to_back: TimingSummary


class BenchToolResult(_Model):
    """Two workloads, each timed in its own processes: the speedups with their confidence intervals."""

    bench_path: str
    out_dir: str
    files: list[str]
    summary: str
    headline: Metric
    speedup: SpeedupEstimate = Field(description="The headline metric's speedup (baseline / optimized).")
    latency_speedup: SpeedupEstimate
    back_to_back_speedup: SpeedupEstimate
    baseline: BenchSideSummary
    optimized: BenchSideSummary
    device_type: str
    device_name: str | None = None
    timer: str
    interpreter: InterpreterInfo
    warnings: list[str] = Field(default_factory=list)


class RecipeRow(_Model):
    """One recipe of the frontier, in brief (recipes.json has the distributions and the code)."""

    recipe: str
    status: str
    tier: str | None = None
    latency_ms: float | None = None
    back_to_back_ms: float | None = None
    max_rel_error: float | None = None
    reason: str | None = None


class RecipesResult(_Model):
    """The free frontier of a workload: every recipe's time and error, the winner of each tier with its code."""

    recipes_path: str
    frontier_chart: str | None = None
    out_dir: str
    files: list[str]
    summary: str
    device: str
    headline: Metric
    winners: list[Winner]
    recipes: list[RecipeRow]
    skipped: list[SkippedRecipes]
    interpreter: InterpreterInfo
    warnings: list[str] = Field(default_factory=list)


class ValidateToolResult(_Model):
    """The verdict on an optimized workload: every check, and where the report is."""

    report_path: str
    out_dir: str
    files: list[str]
    passed: bool
    failed_checks: list[str]
    summary: str
    checks: list[CheckResult]
    device_type: str | None = None
    device_name: str | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    speedup: float | None = None
    max_plausible_speedup: float | None = None
    precision_note: str | None = None
    interpreter: InterpreterInfo
    warnings: list[str] = Field(default_factory=list)


class PreflightCheck(_Model):
    """One preflight check, with the remedy when it failed."""

    name: str
    ok: bool
    detail: str
    remedy: str | None = None
    required: bool = Field(
        default=True, description="Needed by the backend chosen here; false: only the GPU path (nsys + ncu) needs it."
    )


class PreflightResult(_Model):
    """Can this machine profile, and which backend `profile` with backend auto would use."""

    ok: bool
    checks: list[PreflightCheck]
    backend: str = Field(description="'nsys' (nsys + ncu) or 'torch' (torch.profiler).")
    summary: str
    interpreter: InterpreterInfo


class LoopCheckpoint(_Model):
    """One checkpoint file of the loop folder, judged at the stage that first writes it."""

    file: str
    path: str
    stage: StageName = Field(description="The stage that writes it (first).")
    status: StageStatus
    provenance: Provenance | None = Field(
        description="'loop_state': judged by the input hashes its tool recorded; 'mtime': by modification times "
        "(a file an agent wrote, or one rewritten since its record); null when the file is missing."
    )
    tool: LoopTool | None = Field(default=None, description="The tool that wrote it, from loop_state.json.")
    written_at: str | None = Field(default=None, description="When that tool recorded it (ISO 8601, UTC).")
    modified_at: str | None = Field(default=None, description="The file's modification time (ISO 8601, UTC).")
    detail: str


class LoopStage(_Model):
    """One stage of the loop: the files it reads and writes, and how it stands."""

    stage: StageName
    status: StageStatus
    reads: list[str]
    writes: list[str]
    detail: str = Field(description="Why, in one line: which file is missing, stale (and which input changed) or "
                        "failed.")


class OptimizeResult(_Model):
    """The floor: the tier's frontier winner as an optimized workload, its verdicts and where every file is."""

    out_dir: str
    files: list[str]
    summary: str
    tier: str
    recipe: str = Field(description="The tier's winner of the free frontier, applied by the optimized workload.")
    optimized_workload: str
    report_path: str
    validation_passed: bool
    speedup_vs_eager: SpeedupEstimate
    speedup_vs_winner: SpeedupEstimate
    stages: list[str] = Field(description="The stages run, in order.")
    warnings: list[str] = Field(default_factory=list)


class LoopStatusResult(_Model):
    """Where the optimization loop on a workload stands: which stage is next and why, and what a resume reuses."""

    workload: str
    folder: str = Field(description="The workload's folder, holding the loop's checkpoint files.")
    loop_state_path: str | None = Field(description="Its loop_state.json, when a tool has recorded a checkpoint.")
    next_stage: StageName | None = Field(description="The earliest stage not done; null when every stage is done.")
    resume_from: StageName | None = Field(
        description="The --from= value to resume with: the next stage, or for a failed validation the stage that "
        "fixes it (implement)."
    )
    reason: str = Field(description="Why that stage, in one line.")
    summary: str
    stages: list[LoopStage]
    checkpoints: list[LoopCheckpoint]
    reused: list[str] = Field(description="Checkpoint files that are current and stay as they are on resuming.")
    recompute: list[str] = Field(description="Checkpoint files the loop writes (again) from resume_from on.")


class MemoryRun(_Model):
    """What `memory` returns; memory.json holds everything (holders by category, module, operator, line)."""

    run_dir: str
    memory_path: str
    chart_path: str | None = None
    snapshot_path: str = Field(description="Opens in https://pytorch.org/memory_viz.")
    python: str
    torch_version: str | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    attributed_pct: float | None = Field(default=None, description="Bytes live at the peak with a module, %.")
    findings: list[str] = Field(default_factory=list, description="What lowers the peak, upper-bound savings.")
    summary: str = Field(description="Peaks, holders at the peak (or at an out-of-memory failure), findings.")
