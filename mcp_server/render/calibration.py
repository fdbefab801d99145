"""The report's "Estimates against the measurement": what the applied items were expected to give (the plan's
estimates and the analysis's upper bounds), what bench measured, and the speed-of-light ceiling."""

from __future__ import annotations

from pydantic import BaseModel

from mcp_server.render.views import estimate_text
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.optimizations import OptimizationItem, OptimizationPlan
from mcp_server.schema.proof import BenchResult, ValidationReport


class EstimateRow(BaseModel):
    item: str
    plan_estimate: str
    analysis_estimate: str | None


class CalibrationView(BaseModel):
    """The applied changes' estimates beside the measured speedup, under the window's speed of light."""

    rows: list[EstimateRow]
    estimated_low: float
    estimated_high: float
    analysis_estimate: float | None
    analysis_source: str | None
    analysis_covers: str | None  # "1 of 3 applied changes only; ..." when some have no opportunity of their pattern
    measured: float | None
    measured_ci: tuple[float, float] | None
    baseline_how: str | None
    verdict: str
    ceiling: float | None
    ceiling_note: str | None


def _analysis_speedup(analysis: Analysis | None, items: list[OptimizationItem]) -> dict[str, float]:
    """Per applied item, the analysis's estimate as a whole-window speedup (its opportunity of the same pattern)."""
    if analysis is None or analysis.timeline is None:
        return {}
    window = analysis.timeline.window_ns
    out = {}
    for item in items:
        pattern = item.pattern.split("#", 1)[0]
        match = next((o for o in analysis.opportunities if o.knowledge == pattern), None)
        if match is not None and window > match.estimated_saving_ns:
            out[item.id] = window / (window - match.estimated_saving_ns)
    return out


def _plan_span(items: list[OptimizationItem]) -> tuple[float, float]:
    """The applied items' estimates together: the products of their low and high ends."""
    low = high = 1.0
    for item in items:
        low *= item.expected_gain.end_to_end_speedup_low
        high *= item.expected_gain.end_to_end_speedup_high
    return low, high


def calibration_view(plan: OptimizationPlan, validation: ValidationReport | None, bench: BenchResult | None,
                     analysis: Analysis | None, bench_vs_free: BenchResult | None = None) -> CalibrationView | None:
    """What the applied items were expected to give, what bench measured against the same baseline (eager as
    written: bench.json; the frontier's winner: bench_vs_free.json), and the plausible ceiling."""
    applied = validation.applied_passes if validation is not None else {}
    items = [i for i in plan.items if applied.get(i.pass_name)]
    if not items:
        return None
    baselines = {i.expected_gain.against for i in items}
    unmeasured = None  # why no measurement is set beside the estimates, where none can be
    if baselines == {"winner"}:  # the analysis's opportunities are against the baseline as written: not here
        bench, analysis = bench_vs_free, None
        if bench is None:
            unmeasured = ("the estimates are against the frontier's winner and no bench_vs_free.json measured the "
                          "workload against it")
    elif len(baselines) > 1:
        bench, analysis = None, None
        unmeasured = ("the applied items' estimates are against different baselines (eager as written, the "
                      "frontier's winner), so no product of them is set beside a measurement")
    by_analysis = _analysis_speedup(analysis, items)
    low, high = _plan_span(items)
    combined = None
    if by_analysis and analysis is not None and analysis.timeline is not None:
        saved = sum(analysis.timeline.window_ns * (1 - 1 / v) for v in by_analysis.values())
        combined = analysis.timeline.window_ns / max(analysis.timeline.window_ns - saved, 1.0)
    sol = analysis.speed_of_light if analysis is not None else None
    measured = bench.speedup.point if bench is not None else None
    ci = (bench.speedup.ci_low, bench.speedup.ci_high) if bench is not None else None
    if unmeasured is not None:
        verdict = unmeasured
    elif measured is None:
        verdict = "no bench.json: nothing measured to set beside the estimates"
    elif ci is not None and ci[0] <= high and ci[1] >= low:  # the interval reaches the estimate: no verdict beyond it
        verdict = (f"consistent with the estimate: {measured:.2f}× measured (95 % CI {ci[0]:.2f}×–{ci[1]:.2f}×), "
                   f"{low:.2f}×–{high:.2f}× estimated")
    elif measured < low:
        verdict = (f"below the estimate: {measured:.2f}× measured against {low:.2f}×–{high:.2f}× estimated; the "
                   "estimates were too optimistic for this workload")
    elif measured > high:
        verdict = f"above the estimate: {measured:.2f}× measured against {low:.2f}×–{high:.2f}× estimated"
    else:
        verdict = f"within the estimate: {measured:.2f}× measured, {low:.2f}×–{high:.2f}× estimated"
    rest = len(items) - len(by_analysis)
    covers = None if not rest or analysis is None else (f"{len(by_analysis)} of {len(items)} applied changes only; the "
                                    + ("other has no opportunity of its" if rest == 1 else
                                       f"other {rest} have no opportunity of their") + " pattern")
    if measured is not None and combined is not None and covers is None and measured > combined:
        verdict += (f"; the analysis's upper bound ({combined:.2f}×) is below the measurement: its opportunities "
                    "understated these changes")
    ceiling_note = None
    if sol is not None:
        ceiling_note = (f"the baseline runs at {sol.pct_of_speed_of_light:.0f} % of its speed of light; a speedup "
                        f"above {sol.max_plausible_speedup:.2f}× is suspect ({sol.estimate_label})")
        if measured is not None and measured > sol.max_plausible_speedup:
            ceiling_note += f"; the measured {measured:.2f}× exceeds it: check that the optimized side does the work"
    return CalibrationView(
        rows=[EstimateRow(item=f"{i.rank}. {i.title}", plan_estimate=estimate_text(i),
                          analysis_estimate=f"≤ {by_analysis[i.id]:.2f}× (analysis, upper bound)"
                          if i.id in by_analysis else None) for i in items],
        estimated_low=low, estimated_high=high, analysis_estimate=combined,
        analysis_source=("the window measured without the profiler" if analysis.timeline.unprofiled else
                         "the profiled window (no timing pass ran: idle time inflated by instrumentation)")
        if analysis is not None and analysis.timeline is not None else None, analysis_covers=covers,
        measured=measured,
        measured_ci=ci,
        baseline_how=bench.baseline.how_run if bench is not None else None, verdict=verdict,
        ceiling=sol.max_plausible_speedup if sol is not None else None, ceiling_note=ceiling_note,
    )

