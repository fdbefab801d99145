"""The optimized workload against what a user gets for free: eager as written, and the winner of its precision tier
of the free frontier (recipes.json, measured on the same GPU), with the recipe's lines when the recipe wins."""

from __future__ import annotations

from pydantic import BaseModel

from mcp_server.children.contract import GRAPH_MODES, recipe_parts
from mcp_server.render.frontier import runner_up_text
from mcp_server.schema.analysis import SpeedOfLight
from mcp_server.schema.proof import BenchResult
from mcp_server.schema.recipes import RecipesReport


class BaselineRow(BaseModel):
    """The optimized workload against one baseline a user could run instead."""

    label: str
    baseline_how: str
    metric: str
    baseline_median_ns: float
    optimized_median_ns: float
    point: float
    ci_low: float
    ci_high: float
    significant: bool
    other_metric: str
    other_point: float
    file: str


class FrontierView(BaseModel):
    """The frontier's winner of the tier, and how the optimized workload stands against it."""

    tier: str
    recipe: str | None
    recipe_time_ns: float | None
    recipe_speedup_vs_eager: float | None
    reference: str  # what that speedup is against: fp32 eager, or eager as written in the model's own precision
    code: list[str]
    device: str
    recipes_file: str
    verdict: str
    runner_up: str | None = None  # a recipe within the spread of processes of the winner, with its times


class BaselinesView(BaseModel):
    """The optimized workload against eager and the frontier's winner, and what that means."""

    rows: list[BaselineRow]
    frontier: FrontierView | None


def floor_evidence(floor: SpeedOfLight, tier: str) -> str:
    """What the speed-of-light floor says about a workload that is not faster than a free recipe."""
    ms = 1e6
    text = (f" Evidence from the speed-of-light floor ({floor.estimate_label}): the analysed window runs at "
            f"{floor.pct_of_speed_of_light:.0f} % of its speed of light in the precisions its kernels use (floor "
            f"{floor.floor_ns / ms:.3f} ms, window {floor.window_ns / ms:.3f} ms measured without the profiler)")
    if floor.reduced_precision_floor_ns < 0.8 * floor.floor_ns:
        reduced = floor.reduced_precision_floor_ns / ms
        text += f"; with its FP32 FLOPs on BF16 tensor cores the floor would be {reduced:.3f} ms"
        text += (": the exact tier may not lower precision, so what is left between the window and its floor is how "
                 "efficiently the kernels themselves run." if tier == "exact" else ".")
    else:
        text += ("; tensor cores would not lower it (its kernels' math already runs in half precision, or their time "
                 "is bytes): what is left is how efficiently the kernels run, and the time between them.")
    return text


def _row(label: str, bench: BenchResult, file: str) -> BaselineRow:
    s = bench.speedup
    other = "back_to_back" if bench.headline == "latency" else "latency"
    return BaselineRow(
        label=label, baseline_how=bench.baseline.how_run, metric=bench.headline.replace("_", "-"),
        baseline_median_ns=bench.baseline.summary_of(bench.headline).median_ns,
        optimized_median_ns=bench.optimized.summary_of(bench.headline).median_ns, point=s.point, ci_low=s.ci_low,
        ci_high=s.ci_high, significant=s.significant, other_metric=other.replace("_", "-"),
        other_point=(bench.back_to_back_speedup if other == "back_to_back" else bench.latency_speedup).point,
        file=file,
    )


def _verdict(row: BaselineRow | None, recipe: str, code: list[str], tier: str, floor: SpeedOfLight | None,
             applies: str | None = None) -> str:
    lines = "; ".join(f"`{line}`" for line in code)
    if applies == recipe:
        graphs = recipe_parts(recipe)[0] in GRAPH_MODES
        wrapper = "its copy of every output" if graphs else "its wrapper"
        measured = (f": benched against the recipe itself, each in its own processes, {row.point:.3f}× by {row.metric} "
                    f"(95 % CI {row.ci_low:.3f}×–{row.ci_high:.3f}×), the cost of {wrapper} and the spread between "
                    "processes" if row is not None else "")
        text = (f"The optimized workload is the {tier} tier's winner of the free frontier, {recipe}, applied as plain "
                f"code{measured}. Nothing here is faster than what the user gets for free.")
        if graphs:
            text += (" It copies each call's outputs, which the next CUDA graph replay would overwrite in silence; "
                     "the recipe as pasted and as measured does not. Where the copies cost, the whole call replayed "
                     "from one CUDA graph may go beyond the winner (knowledge/fx_patterns/whole_forward_graph.md): "
                     "bench it against the winner before keeping it.")
        return text + (floor_evidence(floor, tier) if floor is not None else "")
    if row is None:
        return (f"The optimized workload was not benched against the {tier} tier's winner, {recipe}: no "
                f"bench_vs_free.json. Until it is, the recipe's lines are the answer to beat: {lines}.")
    measured = (f"{row.point:.3f}× by {row.metric} (95 % CI {row.ci_low:.3f}×–{row.ci_high:.3f}×; "
                f"{row.other_point:.3f}× by {row.other_metric})")
    if row.ci_low > 1.0:
        return f"The optimized workload beats the {tier} tier's winner of the free frontier, {recipe}: {measured}."
    verdict = (f"The optimized workload is slower than the free recipe {recipe}: {measured}. Use the recipe "
               "instead (its lines below)." if row.ci_high < 1.0 else
               f"The optimized workload is level with the free recipe {recipe}: {measured}, not significant. The "
               "recipe gives the same in a few lines (below).")
    return verdict + (floor_evidence(floor, tier) if floor is not None else "")


def baselines_view(
    bench: tuple[BenchResult, str] | None, bench_vs_free: tuple[BenchResult, str] | None,
    recipes: tuple[RecipesReport, str] | None, tier: str = "exact", floor: SpeedOfLight | None = None,
    applies: str | None = None,
) -> BaselinesView | None:
    """Rows for the benches given (against eager, against the frontier's winner), and the verdict against the
    winner of `tier` in recipes.json: plainly slower, level or faster, with the recipe's lines when it wins and what
    the speed-of-light `floor` says. `applies`: the recipe the optimized workload itself applies (its RECIPE)."""
    rows = []
    if bench is not None:
        rows.append(_row("eager (as written)", *bench))
    free_row = None
    if bench_vs_free is not None:
        free_row = _row(f"{bench_vs_free[0].tier or tier} tier's frontier winner", *bench_vs_free)
        rows.append(free_row)
    frontier = None
    if recipes is not None:
        report, file = recipes
        metric = bench_vs_free[0].headline if bench_vs_free is not None else "latency"
        winner = report.winner(tier, metric)
        recipe = winner.recipe if winner is not None else None
        verdict = (_verdict(free_row, recipe, winner.code, tier, floor, applies)
                   if winner is not None and recipe is not None
                   else f"No recipe of {file} validated in the {tier} tier.")
        frontier = FrontierView(
            tier=tier, recipe=recipe, recipe_time_ns=winner.time_ns if winner else None,
            recipe_speedup_vs_eager=winner.speedup_vs_reference if winner else None,
            reference=report.reference_label, code=winner.code if winner else [],
            device=report.device_name or report.device_type, recipes_file=file,
            verdict=verdict, runner_up=runner_up_text(report, tier, metric),
        )
    if not rows and frontier is None:
        return None
    return BaselinesView(rows=rows, frontier=frontier)
