"""The free frontier as a person reads it: a table for the terminal and frontier.png (time against error), and what
it measured of a pattern the analysis offers beyond its winner (`tried_on_winner`, `failed_on_frontier`).

Every time is a median per call measured in the recipe's own process; every error is against fp32 eager with TF32
off, over the seeds recipes.json names.
"""

from __future__ import annotations

from pathlib import Path

from mcp_server.analysis.charts import pyplot, save_png
from mcp_server.analysis.pattern_registry import PATTERNS, covered_by
from mcp_server.children.contract import changed_part, written_floor
from mcp_server.proof.recipes import short_reason
from mcp_server.proof.stats import PROCESS_SPREAD
from mcp_server.schema.proof import Metric
from mcp_server.schema.recipes import RecipeResult, RecipesReport
from mcp_server.schema.types import TIERS, tiers_within

FRONTIER_PNG = "frontier.png"
TIER_COLORS = {"exact": "#2ca02c", "reduced": "#1f77b4", "fp8": "#9467bd", None: "#d62728"}
ERROR_FLOOR = 1e-9  # where an error of exactly 0 sits on the log axis


def _ms(ns: float | None) -> str:
    return f"{ns / 1e6:9.3f}" if ns is not None else f"{'-':>9s}"


def _error(result: RecipeResult) -> str:
    error = result.error.max_rel_error if result.error is not None else None
    return f"{error:9.1e}" if error is not None else f"{'-':>9s}"


def format_recipes(report: RecipesReport, metric: Metric = "latency") -> str:
    """The frontier as a fixed-width table ranked by `metric`, each tier's winner with its lines, and what was
    skipped and why."""
    ref = report.result(report.reference)
    ref_ns = ref.time_ns(metric) if ref is not None else None
    device = report.device_name or report.device_type
    header = (f"{'recipe':56s} {'latency ms':>10s} {'b2b ms':>9s} {'vs eager':>8s} {'max rel err':>11s} "
              f"{'tier':8s} status")
    lines = [f"free frontier of {Path(report.workload).name} on {device} (torch {report.torch_version}): "
             f"medians per call, each recipe in its own process; errors against {report.reference}"
             + ("" if report.reference_label == "fp32 eager" else f" ({report.reference_label}: fp32 in a recipe's "
                "name keeps the model's own precision)")
             + " over seeds "
             f"{','.join(map(str, report.seeds))}; ranked by {metric.replace('_', '-')}", header, "-" * len(header)]
    for r in report.results:
        t = r.time_ns(metric)
        vs = f"{ref_ns / t:7.2f}x" if ref_ns and t else f"{'-':>8s}"
        status = r.status if r.status != "ok" else ("ok" if r.tier else "failed validation")
        reason = f": {r.reason[:70]}" if r.reason else ""
        lines.append(f"{r.recipe[:56]:56s} {_ms(r.time_ns('latency')):>10s} {_ms(r.time_ns('back_to_back'))} {vs} "
                     f"{_error(r):>11s} {r.tier or '-':8s} {status}{reason}")
    written = report.written_error
    if written is not None and written.max_rel_error is not None:
        p99 = (written.rel_error_percentiles or {}).get("p99")
        lines.append(f"{report.reference_label} is {written.max_rel_error:.2g} from itself in float32 at most"
                     + (f" (p99 {p99:.2g})" if p99 is not None else "")
                     + ": every tier's tolerance is at least twice that, "
                     f"{written_floor(written.max_rel_error):.2g} (two implementations of the model may each be that "
                     "far from fp32)")
    tighter = None
    for tier in TIERS:
        winner = report.winner(tier, metric)
        if winner is None:
            lines.append(f"{tier} tier: no recipe validated")
            continue
        if tighter is not None and winner.recipe == tighter.recipe:  # a looser tier won by a tighter tier's recipe
            lines.append(f"{tier} tier winner: {winner.recipe}, the {tighter.tier} tier's")
            continue
        tighter = winner
        speed = f", {winner.speedup_vs_reference:.2f}x {report.reference_label}" if winner.speedup_vs_reference else ""
        lines.append(f"{tier} tier winner by {metric.replace('_', '-')}: {winner.recipe} "
                     f"({winner.time_ns / 1e6:.3f} ms{speed}):")
        lines += [f"    {line}" for line in winner.code]
        close = runner_up_text(report, tier, metric)
        if close is not None:
            lines.append(f"    (close behind it: {close})")
    if report.runoff_rounds:
        ran = [r.recipe for r in report.results if r.runoff]
        raced = report.runoff_tiers
        tiers = ("" if not raced else f" of the {raced[0]} tier's race" if len(raced) == 1
                 else f" of the {', '.join(raced[:-1])} and {raced[-1]} tiers' races")
        lines.append(f"runoff{tiers}: {report.runoff_rounds} more process(es) each for "
                     f"{', '.join(ran)} (within {PROCESS_SPREAD:.2f}x of the winner); their times are the medians of "
                     "their processes' medians" + (f"; it changed {'; '.join(report.runoff_changed)}"
                                                   if report.runoff_changed else "; no winner changed"))
    for group in report.skipped:
        lines.append(f"skipped {len(group.recipes)}: {group.reason}")
    return "\n".join(lines)


def runner_up(report: RecipesReport, tier: str, metric: Metric = "latency") -> RecipeResult | None:
    """The fastest other recipe valid in `tier` within `PROCESS_SPREAD` of its winner's time by `metric` (closer
    than that, one process each does not tell them apart; `runner_up_text` says what the runoff's did); None
    otherwise."""
    winner = report.winner(tier, metric)
    if winner is None:
        return None
    within = set(tiers_within(tier))
    close = [r for r in report.results if r.status == "ok" and r.tier in within and r.recipe != winner.recipe
             and (r.time_ns(metric) or float("inf")) <= winner.time_ns * PROCESS_SPREAD]
    return min(close, key=lambda r: r.time_ns(metric) or float("inf")) if close else None


def runner_up_text(report: RecipesReport, tier: str, metric: Metric = "latency") -> str | None:
    """The tier's runner-up within `PROCESS_SPREAD` of its winner, in words: its time, over how many processes, and
    whether those tell it from the winner; None when there is none."""
    close, winner = runner_up(report, tier, metric), report.winner(tier, metric)
    time = close.time_ns(metric) if close is not None else None
    first = report.result(winner.recipe) if winner is not None else None
    if close is None or time is None or first is None:
        return None
    by = metric.replace("_", "-")
    theirs, ours = close.process_medians(metric), first.process_medians(metric)
    if len(theirs) < 2 and len(ours) < 2:
        return (f"{close.recipe} measured {time / 1e3:.1f} µs by {by} in its own process, within the "
                f"{PROCESS_SPREAD:.2f}× by which the processes of one host-bound recipe can differ: one process each "
                "does not tell the two apart (`recipes --runoff 2` runs each again, or `bench` the two)")
    if len(theirs) < 2 or len(ours) < 2:
        return (f"{close.recipe} measured {time / 1e3:.1f} µs by {by} in {len(theirs)} process(es), the winner "
                f"{_span(ours)} in {len(ours)}: within the {PROCESS_SPREAD:.2f}× by which the processes of one "
                "host-bound recipe can differ, and not raced against it (`bench` the two to tell them apart)")
    said = (f"{close.recipe} measured {time / 1e3:.1f} µs by {by}, the median of {len(theirs)} processes "
            f"({_span(theirs)}; the winner's {len(ours)}: {_span(ours)})")
    if max(ours) < min(theirs):
        return f"{said}: slower than the winner in every process"
    return (f"{said}: their processes overlap, so which of the two is faster is not settled (`bench` them with more "
            "--rounds)")


def _span(medians: list[float]) -> str:
    low, high = min(medians), max(medians)
    return f"{low / 1e3:.1f}–{high / 1e3:.1f} µs"


def frontier_chart(report: RecipesReport, path: Path) -> Path | None:
    """Latency against max relative error, one point per recipe that ran, coloured by tier, the Pareto front joined;
    None (nothing written) when no recipe has a time."""
    points = [(r, r.time_ns("latency"), (r.error.max_rel_error if r.error else None) or 0.0)
              for r in report.results if r.time_ns("latency") is not None]
    if not points:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for result, ns, error in points:
        x = max(error, ERROR_FLOOR)
        ax.scatter([x], [(ns or 0) / 1e6], color=TIER_COLORS[result.tier], s=30, zorder=3)
        ax.annotate(result.recipe, (x, (ns or 0) / 1e6), fontsize=6, xytext=(3, 2), textcoords="offset points")
    front = sorted(((max(e, ERROR_FLOOR), (ns or 0) / 1e6) for r, ns, e in points if r.recipe in report.pareto))
    if front:
        ax.plot([x for x, _ in front], [y for _, y in front], "-", color="black", lw=1, zorder=2,
                label="Pareto front (nothing both faster and more exact)")
    for tier, color in TIER_COLORS.items():
        ax.scatter([], [], color=color, label=f"tier {tier}" if tier else "failed validation")
    for tier, rtol in report.tier_rtol.items():
        ax.axvline(rtol, color=TIER_COLORS.get(tier, "gray"), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"max relative error against {report.reference} (0 drawn at {ERROR_FLOOR:g})")
    ax.set_ylabel("latency per call (ms, median)")
    ax.set_title(f"free frontier of {Path(report.workload).name} on {report.device_name or report.device_type}",
                 fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.2)
    save_png(fig, path)
    plt.close(fig)
    return path


def tried_on_winner(change_class: str, recipe: str, frontier: RecipesReport) -> str | None:
    """What the frontier measured of pattern `change_class` applied to its winner `recipe` (channels-last added to
    `reduce-overhead+fp16-cast`, reduce-overhead in place of `compile+fp16-cast`'s compile), in words with both
    latencies; None when no such recipe ran."""
    ran = {r.recipe: r for r in frontier.results if r.status == "ok"}
    winner = ran.get(recipe)
    base = winner.time_ns("latency") if winner is not None else None
    if change_class not in PATTERNS or winner is None or not base:
        return None
    for result in ran.values():
        time = result.time_ns("latency")
        if changed_part(recipe, result.recipe) in PATTERNS[change_class].recipes and time:
            verdict = "slower" if time > base else "faster" if result.tier == winner.tier else "faster, another tier"
            return (f"the frontier measured it on its winner: {result.recipe}, {time / 1e3:.1f} µs against "
                    f"{base / 1e3:.1f} µs by latency ({verdict}; recipes.json)")
    return None


def failed_on_frontier(change_class: str, frontier: RecipesReport) -> str | None:
    """What the frontier found of pattern `change_class` when every recipe applying it to the whole model failed to
    run or to validate in any tier (the Fourier operator's bfloat16 and float16: no bfloat16 FFT, no complex-half
    einsum), in words with the first failure; None when one of them ran within a tier, or none was tried."""
    if change_class not in PATTERNS:
        return None
    tried = [r for r in frontier.results if covered_by(change_class, r.recipe)]
    if not tried or any(r.status == "ok" and r.tier is not None for r in tried):
        return None
    first = tried[0]
    why = first.reason or ("its error met no tier" if first.status == "ok" else first.status.replace("_", " "))
    return (f"the frontier applied it to the whole model in {len(tried)} recipe(s) and none ran within a tier "
            f"({first.recipe}: {short_reason(why)}; "
            "recipes.json): only a change scoped to the kernels named here can apply it")
