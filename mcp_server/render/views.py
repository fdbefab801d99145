"""View models of the four documents: pure functions from the loaded files to what the templates print.

Templates only format; every number and every decision (which speedup to state, what counts as applied,
what is left to do) is made here, where it is typed and tested.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pydantic import BaseModel, Field

from mcp_server.analysis.pattern_registry import PATTERNS, allowed_in, covered_by, needed_tier
from mcp_server.compare import COUNTERS, total
from mcp_server.queries import top_operators
from mcp_server.render.frontier import failed_on_frontier, tried_on_winner
from mcp_server.render.inputs import ReportInputs
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.optimizations import OptimizationItem, OptimizationPlan
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.proof import BenchResult, ClockReading, Comparison, ValidationReport
from mcp_server.schema.recipes import RecipesReport
from mcp_server.schema.results import OperatorSummary

COUNTER_LABELS = {
    "achieved_occupancy_pct": "occupancy %",
    "tensor_core_active_pct": "tensor core %",
    "sm_throughput_pct": "SM throughput %",
    "dram_throughput_pct": "DRAM throughput %",
    "l1_hit_rate_pct": "L1 hit %",
    "l2_hit_rate_pct": "L2 hit %",
    "arithmetic_intensity_flop_per_byte": "FLOP/byte",
}
TOTALS_SHOWN = ("gpu_kernel_time_ns", "gpu_busy_time_ns", "kernel_count", "unattributed_kernel_time_ns", "dram_bytes",
                "window_wall_time_per_iter_ns", "cpu_operator_time_ns")
TOTALS_SHOWN_WHEN_NONZERO = {"unattributed_kernel_time_ns"}
IR_LEVEL_HOW = {
    "functional": "an FX pass on the torch-level graph Dynamo hands the registered backend, before compile_fx",
    "aten": "a pass on the aten graph after AOTAutograd (torch._inductor.config.post_grad_custom_post_pass, or "
    "an aot_autograd fw_compiler)",
    "inductor-config": "Inductor options passed as compile_fx(gm, example_inputs, config_patches=...) inside the "
    "backend (never global torch settings)",
    "module": "a change to the nn.Module inside optimize(model), after the baseline's weights are loaded and before "
    "torch.compile (e.g. its parameters' dtype)",
    "dynamo": "TorchDynamo's own settings, scoped with torch._dynamo.config.patch inside optimize(), or a source "
    "edit that keeps the model one graph",
}


class DeviceView(BaseModel):
    name: str
    type: str
    sm_count: int | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str
    tool: str
    tool_versions: dict[str, str] = Field(default_factory=dict)


class ClockView(BaseModel):
    when: str
    sm_mhz: float | None = None
    memory_mhz: float | None = None
    source: str


class SpeedupView(BaseModel):
    point: float
    ci_low: float
    ci_high: float
    ci_level: float
    significant: bool
    baseline_median_ns: float
    optimized_median_ns: float
    samples_per_side: int
    metric: str
    rounds: int
    other_metric: str
    other_point: float
    timer: str
    device: str
    baseline_how: str
    optimized_how: str
    method: str
    warnings: list[str] = Field(default_factory=list)


class CheckView(BaseModel):
    name: str
    status: str
    detail: str


class ValidationView(BaseModel):
    passed: bool
    device: str
    seeds: list[int]
    backend_name: str | None
    backend_calls: int | None
    applied_passes: dict[str, int]
    tolerances: dict[str, float]
    max_abs_error: float | None
    max_rel_error: float | None
    worst_output: str | None = None
    worst_percentiles: dict[str, float] | None = None
    tier: str = "exact"
    precision_note: str | None
    reduced_dtype_outputs: list[str] = Field(
        default_factory=list, description="Outputs returned in a lower precision than the baseline's (reduced tier)."
    )
    failed_checks: list[str]
    checks: list[CheckView]
    warnings: list[str] = Field(default_factory=list)


class CounterChange(BaseModel):
    label: str
    before: float | None = None
    after: float | None = None


class OperatorChange(BaseModel):
    operator_name: str
    module_path: str
    status: str
    absorbed: list[str] = Field(default_factory=list)
    time_before_ns: int | None = None
    time_after_ns: int | None = None
    speedup: float | None = None
    kernels_before: int | None = None
    kernels_after: int | None = None
    dram_before: float | None = None
    dram_after: float | None = None
    counters: list[CounterChange] = Field(default_factory=list)


class TotalView(BaseModel):
    name: str
    baseline: float | None
    optimized: float | None
    speedup: float | None


class ItemView(BaseModel):
    """One optimizations.json item with what became of it."""

    rank: int
    id: str
    title: str
    ir_level: str
    ir_how: str
    target: str
    evidence: list[str]
    rationale: str
    estimate: str
    pattern: str
    pass_name: str
    precision_change: bool
    risks: list[str]
    status: str
    status_reason: str | None
    applied_count: int | None = Field(default=None, description="Times validate saw the pass applied.")
    applied: bool = False


class ResidualView(BaseModel):
    source: str
    title: str
    target: str
    evidence: str = ""
    estimate: str = ""
    pattern: str = ""


class HotspotView(BaseModel):
    operator_name: str
    modules: str
    calls: int
    kernels: int
    time_ns: int
    share_pct: float


# --------------------------------------------------------------------------- builders


def device_view(profile: OperatorAttributedProfile) -> DeviceView:
    """The device and software a profile was captured on."""
    meta = profile.capture_metadata
    return DeviceView(
        name=meta.device_name or meta.device_type, type=meta.device_type, sm_count=meta.sm_count,
        compute_capability=meta.compute_capability, driver=meta.driver_version, cuda=meta.cuda_version,
        torch=meta.torch_version, tool=meta.tool, tool_versions=meta.tool_versions,
    )


def _replay_clock(profile: OperatorAttributedProfile, label: str) -> ClockView | None:
    kernels = [k for op in profile.operators for k in op.kernels] + list(profile.unattributed_kernels)
    sm = [k.metrics["sm_clock_hz"].value for k in kernels if "sm_clock_hz" in k.metrics]
    mem = [k.metrics["dram_clock_hz"].value for k in kernels if "dram_clock_hz" in k.metrics]
    if not sm:
        return None
    return ClockView(when=f"{label}: ncu replay (counters)", sm_mhz=statistics.median(sm) / 1e6,
                     memory_mhz=statistics.median(mem) / 1e6 if mem else None,
                     source="median of the kernels' smsp__cycles_elapsed.avg.per_second; ncu locks clocks to base")


def _gpu0(readings: list[ClockReading]) -> ClockReading | None:
    return next((r for r in readings if r.gpu_index == 0), None)


def clock_views(inputs: ReportInputs) -> list[ClockView]:
    """Every clock the files record, each labelled with when and how it was read."""
    views = []
    for label, profile in (("baseline profile", inputs.baseline), ("optimized profile", inputs.optimized)):
        if profile is None:
            continue
        clocks = profile.capture_metadata.clocks
        if clocks.sm_clock_mhz is not None and clocks.samples:
            low, _, high = clocks.sm_clock_range_mhz or [clocks.sm_clock_mhz] * 3
            views.append(ClockView(when=f"{label}: while its window ran (median; SM {low:.0f}-{high:.0f} MHz)",
                                   sm_mhz=clocks.sm_clock_mhz, memory_mhz=clocks.memory_clock_mhz,
                                   source=f"{clocks.source} ({clocks.samples} samples)"))
        elif clocks.sm_clock_mhz is not None:
            views.append(ClockView(when=f"{label}: before capture", sm_mhz=clocks.sm_clock_mhz,
                                   memory_mhz=clocks.memory_clock_mhz,
                                   source=f"{clocks.source or 'unknown'} (an idle GPU reports its idle clock)"))
        replay = _replay_clock(profile, label)
        if replay is not None:
            views.append(replay)
    bench = inputs.bench
    if bench is not None and bench.clocks.source == "nvidia-smi":
        for when, readings in (("before", bench.clocks.before), ("first timed window", bench.clocks.during),
                               ("after", bench.clocks.after)):
            reading = _gpu0(readings)
            if reading is not None:
                views.append(ClockView(when=f"bench: {when}", sm_mhz=reading.sm_clock_mhz,
                                       memory_mhz=reading.memory_clock_mhz, source="nvidia-smi, GPU 0, never changed"))
    return views


def speedup_view(bench: BenchResult) -> SpeedupView:
    """The measured speedup as bench.json gives it (the ratio of medians, or in turns the median of the paired
    blocks' ratios) with its bootstrap interval."""
    s = bench.speedup
    return SpeedupView(
        point=s.point, ci_low=s.ci_low, ci_high=s.ci_high, ci_level=s.ci_level, significant=s.significant,
        baseline_median_ns=bench.baseline.summary_of(bench.headline).median_ns,
        optimized_median_ns=bench.optimized.summary_of(bench.headline).median_ns,
        samples_per_side=bench.baseline.summary_of(bench.headline).samples, metric=bench.headline.replace("_", "-"),
        rounds=bench.rounds, other_metric="back-to-back" if bench.headline == "latency" else "latency",
        other_point=(bench.back_to_back_speedup if bench.headline == "latency" else bench.latency_speedup).point,
        timer=bench.timer,
        device=bench.device_name or bench.device_type, baseline_how=bench.baseline.how_run,
        optimized_how=bench.optimized.how_run, method=s.method, warnings=bench.warnings,
    )


def _dtype_name(dtype: str | None) -> str:
    return (dtype or "?").removeprefix("torch.")


def validation_view(report: ValidationReport) -> ValidationView:
    """The verdict, the per-check results and the measured errors (the error distribution of the output with the
    largest relative error)."""
    outputs = [o for c in report.checks for o in c.outputs if o.rel_error_percentiles and o.max_rel_error is not None]
    worst = max(outputs, key=lambda o: o.max_rel_error or 0.0, default=None)
    lowered = {f"{o.output} {_dtype_name(o.dtype)} (baseline {_dtype_name(o.baseline_dtype)})": None
               for c in report.checks for o in c.outputs if o.baseline_dtype and o.baseline_dtype != o.dtype}
    return ValidationView(
        reduced_dtype_outputs=list(lowered),
        worst_output=f"{worst.output} (seed {worst.seed}, inputs {worst.input_set})" if worst else None,
        worst_percentiles=worst.rel_error_percentiles if worst else None, tier=report.tier,
        passed=report.passed, device=report.device_name or report.device_type or "unknown", seeds=report.seeds,
        backend_name=report.backend_name, backend_calls=report.backend_calls, applied_passes=report.applied_passes,
        tolerances=report.tolerances, max_abs_error=report.max_abs_error, max_rel_error=report.max_rel_error,
        precision_note=report.precision_note, failed_checks=report.failed_checks,
        checks=[CheckView(name=c.name, status=c.status, detail=c.detail) for c in report.checks],
        warnings=report.warnings,
    )


def totals_view(comparison: Comparison) -> list[TotalView]:
    """Window totals of both profiles (sums of kernel durations: context, not the speedup)."""
    rows = []
    for name in TOTALS_SHOWN:
        t = total(comparison, name)
        if name in TOTALS_SHOWN_WHEN_NONZERO and t is not None and not (t.baseline or t.optimized):
            continue
        if t is not None and (t.baseline is not None or t.optimized is not None):
            rows.append(TotalView(name=name, baseline=t.baseline, optimized=t.optimized, speedup=t.speedup))
    return rows


def operator_changes(comparison: Comparison, limit: int = 15) -> list[OperatorChange]:
    """The operators whose time changed most, with their counters before and after."""
    deltas = sorted(comparison.operators, key=lambda d: -abs(d.time_delta_ns))[:limit]
    rows = []
    for d in deltas:
        before, after = d.baseline, d.optimized
        names = [n for n in COUNTERS if (before and n in before.counters) or (after and n in after.counters)]
        rows.append(OperatorChange(
            operator_name=d.operator_name, module_path=d.module_path or "–", status=d.status,
            absorbed=d.absorbed_operators,
            time_before_ns=before.time_ns if before else None, time_after_ns=after.time_ns if after else None,
            speedup=(before.time_ns / after.time_ns) if before and after and after.time_ns > 0 else None,
            kernels_before=before.kernel_count if before else None,
            kernels_after=after.kernel_count if after else None,
            dram_before=before.dram_bytes if before else None, dram_after=after.dram_bytes if after else None,
            counters=[CounterChange(label=COUNTER_LABELS.get(n, n), before=before.counters.get(n) if before else None,
                                    after=after.counters.get(n) if after else None) for n in names],
        ))
    return rows


def _target_text(item: OptimizationItem) -> str:
    module = f" in `{item.target.module_path}`" if item.target.module_path else ""
    return f"`{item.target.operator_name}`{module}"


def estimate_text(item: OptimizationItem) -> str:
    """An item's expected gain as the documents print it: the end-to-end span, the share of the targeted
    operators' time and the basis, labelled an estimate."""
    gain = item.expected_gain
    span = f"{gain.end_to_end_speedup_low:.2f}×–{gain.end_to_end_speedup_high:.2f}×"
    share = f"; {gain.operator_time_saved_pct:.0f} % of the targeted operators' time" \
        if gain.operator_time_saved_pct is not None else ""
    against = " against the frontier's winner" if gain.against == "winner" else ""
    return f"estimate: {span} end to end{against}{share} ({gain.basis})"


def item_views(plan: OptimizationPlan, validation: ValidationReport | None = None) -> list[ItemView]:
    """Each item with its status; applied means validate saw its pass_name in APPLIED_PASSES."""
    applied = validation.applied_passes if validation is not None else {}
    views = []
    for item in plan.items:
        count = applied.get(item.pass_name) if validation is not None else None
        views.append(ItemView(
            rank=item.rank, id=item.id, title=item.title, ir_level=item.ir_level, ir_how=IR_LEVEL_HOW[item.ir_level],
            target=_target_text(item),
            evidence=[f"{e.metric}={e.value:g}{(' ' + e.unit) if e.unit else ''}"
                      + (f" ({e.condition})" if e.condition else "") + (f" at {e.source}" if e.source else "")
                      for e in item.evidence],
            rationale=item.rationale, estimate=estimate_text(item), pattern=item.pattern, pass_name=item.pass_name,
            precision_change=item.precision_change, risks=item.risks, status=item.status,
            status_reason=item.status_reason, applied_count=count, applied=bool(count),
        ))
    return views


def diagnosis_text(analysis: Analysis) -> str:
    """The analysis's verdict in one line: bottleneck class, root cause, triggers."""
    d = analysis.diagnosis
    triggers = f" ({', '.join(d.triggers)})" if d.triggers else ""
    return f"{d.bottleneck.value}: {d.root_cause}{triggers}"


def residual_from_analysis(analysis: Analysis, applied: list[OptimizationItem], recipe: str | None = None,
                           tier: str | None = None, frontier: RecipesReport | None = None) -> list[ResidualView]:
    """The analysis's ranked opportunities that no applied item addressed (same pattern, or shared operators) and
    that the free recipe the optimized workload applies (`recipe`) does not already apply (pattern_registry); those
    precision tier `tier` does not allow (a reduced-precision change in the exact tier) last, saying so, and after
    them those the frontier (`frontier`, recipes.json) measured on its winner, with the measurement. One whose every
    whole-model recipe failed on the frontier keeps its place and says so (`failed_on_frontier`)."""
    patterns = {item.pattern.split("#", 1)[0] for item in applied}
    operator_ids = {op for item in applied for op in item.target.operator_ids}
    rows: list[ResidualView] = []
    outside: list[ResidualView] = []
    measured: list[ResidualView] = []
    for opp in analysis.opportunities:
        if opp.knowledge in patterns or operator_ids & set(opp.operators):
            continue
        if recipe is not None and opp.change_class in PATTERNS and covered_by(opp.change_class, recipe):
            continue
        where = ", ".join(opp.module_paths[:4]) or "the window"
        ops = f"`{', '.join(opp.operators[:3])}`{' …' if len(opp.operators) > 3 else ''} in " if opp.operators else ""
        allowed = tier is None or allowed_in(opp.change_class, tier)
        tried = tried_on_winner(opp.change_class, recipe, frontier) if recipe and frontier else None
        failed = failed_on_frontier(opp.change_class, frontier) if frontier and not tried else None
        # one moved after the others keeps its analysis rank in words: "#2" above "#1" would read as a misprint
        title = f"#{opp.rank} {opp.title}" if allowed and not tried else f"{opp.title} (analysis #{opp.rank})"
        title += "" if allowed else f" — outside this report's {tier} tier (needs {needed_tier(opp.change_class)})"
        title += f" — {tried or failed}" if tried or failed else ""
        (measured if tried else rows if allowed else outside).append(ResidualView(
            source="analysis.json", title=title, target=ops + where,
            evidence=", ".join(opp.triggers), pattern=opp.knowledge,
            estimate=f"{opp.estimated_saving_pct:.1f} % of the window; {opp.estimate_label}",
        ))
    return rows + outside + measured


def hotspots(profile: OperatorAttributedProfile, limit: int = 8) -> list[HotspotView]:
    """The operators that hold the most time (GPU kernel time, CPU time without a GPU)."""
    def view(row: OperatorSummary) -> HotspotView:
        time = row.gpu_time_ns if profile.capture_metadata.gpu_used else (row.cpu_total_time_ns or 0)
        return HotspotView(operator_name=row.operator_name, modules=", ".join(row.module_paths) or "–",
                           calls=row.calls, kernels=row.kernels, time_ns=time, share_pct=row.share_pct)

    return [view(r) for r in top_operators(profile, limit)]


def residual_views(inputs: ReportInputs, items: list[ItemView]) -> list[ResidualView]:
    """What is left: analysis opportunities not addressed, plan items not applied, where the time is now."""
    plan = inputs.optimizations
    applied = [i for i, v in zip(plan.items if plan else [], items, strict=True) if v.applied]
    recipe = inputs.validation.recipe if inputs.validation is not None else None
    tier = inputs.validation.tier if inputs.validation is not None else None
    rows = (residual_from_analysis(inputs.analysis, applied, recipe, tier, inputs.recipes)
            if inputs.analysis is not None else [])
    for view in items:
        if not view.applied:
            rows.append(ResidualView(source="optimizations.json", title=f"#{view.rank} {view.title} ({view.status})",
                                     target=view.target, evidence="; ".join(view.evidence), estimate=view.estimate,
                                     pattern=view.pattern))
    now = inputs.optimized or inputs.baseline
    label = "optimized profile" if inputs.optimized is not None else "baseline profile"
    lost_ns = now.unattributed_kernel_time_ns()
    if lost_ns and now.capture_metadata.gpu_used and now.window.kernel_time_ns:
        by_name: dict[str, int] = {}
        for k in now.unattributed_kernels:
            by_name[k.kernel_name] = by_name.get(k.kernel_name, 0) + k.duration_ns
        unattributed = [k for k in now.unattributed_kernels if k.duration_ns]
        rows.append(ResidualView(
            source=label,
            title=f"{100.0 * lost_ns / now.window.kernel_time_ns:.1f} % of the kernel time is in kernels no operator "
                  "encloses",
            target=f"{len(unattributed)} unattributed kernel(s), e.g. `{max(by_name, key=by_name.__getitem__)[:80]}`",
            evidence="launched outside every operator range: CUDA-graph replays of a graph the workload captures "
                     "itself, or launches from code the profiler does not annotate; they are in the profile's "
                     "unattributed_kernels"))
    gpu = now.capture_metadata.gpu_used
    for spot in hotspots(now, 3):
        rows.append(ResidualView(source=label, title=f"{spot.share_pct:.1f} % of the "
                                 f"{'kernel' if gpu else 'CPU operator'} time is still here",
                                 target=f"`{spot.operator_name}` in {spot.modules}",
                                 evidence=f"{spot.calls} call(s)" + (f", {spot.kernels} kernel(s)" if gpu else "")))
    return rows


class Note(BaseModel):
    """A caveat a document must print: `about` is 'bench', 'validation' or 'profiles'."""

    about: str
    text: str


def consistency_notes(inputs: ReportInputs) -> list[Note]:
    """Where the files do not describe the same thing, or a result needs a caveat."""
    notes = []
    base = inputs.baseline.capture_metadata
    bench, validation = inputs.bench, inputs.validation
    if bench is not None:
        bench_device, profile_device = bench.device_name or bench.device_type, base.device_name or base.device_type
        if bench_device != profile_device:
            notes.append(Note(about="bench", text=f"bench.json was measured on {bench_device}, the profiles on "
                              f"{profile_device}: the speedup and the counters describe different machines"))
        if not bench.speedup.significant:
            notes.append(Note(about="bench", text="the speedup's confidence interval contains 1.0: no speed change "
                              "is established"))
    else:
        notes.append(Note(about="bench", text="no bench.json: no speedup is claimed"))
    if validation is not None:
        if not validation.passed:
            notes.append(Note(about="validation", text=f"validation FAILED ({', '.join(validation.failed_checks)}): "
                              "the optimized workload is not a correct replacement"))
        if bench is not None and Path(validation.optimized).name != Path(bench.optimized.workload).name:
            notes.append(Note(about="validation", text=f"validate checked {validation.optimized} but bench timed "
                              f"{bench.optimized.workload}"))
    else:
        notes.append(Note(about="validation", text="no validation_report.json: nothing here says the optimized "
                          "workload is correct"))
    if inputs.comparison is not None and inputs.comparison.mismatches:
        notes.append(Note(about="profiles", text="the profiles were compared despite: "
                          + "; ".join(inputs.comparison.mismatches)))
    return notes
