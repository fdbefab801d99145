"""The answer report.md opens with, in under 300 words: what was slow, what changed, the speedup against eager and
against the frontier's winner of the same tier, the validation verdict; the recipe's lines when the recipe wins.

Every number comes from the files the report is rendered from (bench.json, bench_vs_free.json, recipes.json,
validation_report.json, the profiles); a ratio of two precisions says so on its own line.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from mcp_server.children.contract import recipe_parts
from mcp_server.render.baselines import BaselinesView
from mcp_server.render.inputs import ReportInputs
from mcp_server.render.views import hotspots

TIME_CHART = "time_by_operator.png"


class SummaryView(BaseModel):
    """The report's first section."""

    slow: list[str]
    chart: str | None
    changed: list[str]
    speedup: str | None
    frontier: str | None
    code: list[str]
    validation: str | None


def _ratio(point: float, low: float, high: float) -> str:
    """A speedup with its interval, said to be no established change when the interval holds 1.0."""
    level = ", not significant: the interval contains 1.0" if low <= 1.0 <= high else ""
    return f"{point:.2f}× (95 % CI {low:.2f}×–{high:.2f}×{level})"


def _few(modules: str, shown: int = 2) -> str:
    """The first `shown` module paths of a comma-separated list, and how many more."""
    paths = modules.split(", ")
    return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def _chart(inputs: ReportInputs, out_dir: Path) -> str | None:
    """The baseline analysis's time chart, as a path relative to the report's folder."""
    for analysis in (inputs.baseline_analysis_path, inputs.analysis_path if inputs.optimized is None else None):
        if analysis is not None and (analysis.parent / TIME_CHART).is_file():
            return os.path.relpath(analysis.parent / TIME_CHART, out_dir)
    return None


def _lowers_precision(inputs: ReportInputs, baselines: BaselinesView | None) -> bool:
    """Whether the optimized workload computes in lower precision than fp32: a change of its plan says so, or the
    frontier's winner it starts from is not an fp32 recipe (unknown without recipes.json: assumed)."""
    plan = inputs.optimizations
    if plan is not None and any(i.precision_change and i.status != "rejected" for i in plan.items):
        return True
    recipe = baselines.frontier.recipe if baselines is not None and baselines.frontier is not None else None
    return recipe is None or recipe_parts(recipe)[1] != "fp32"


def summary_view(inputs: ReportInputs, baselines: BaselinesView | None, changed: list[str],
                 out_dir: Path) -> SummaryView:
    """The first section of report.md, from the inputs and the views already built."""
    gpu = inputs.baseline.capture_metadata.gpu_used
    unit = "kernel time" if gpu else "CPU operator time"
    slow = [f"`{h.operator_name}` in {_few(h.modules)}: {h.share_pct:.0f} % of the {unit}"
            for h in hotspots(inputs.baseline, 3)]
    validation = inputs.validation
    tier = validation.tier if validation is not None else None
    speedup = None
    if inputs.bench is not None:
        s, device = inputs.bench.speedup, inputs.bench.device_name or inputs.bench.device_type
        speedup = (f"{_ratio(s.point, s.ci_low, s.ci_high)} against eager as written, by "
                   f"{inputs.bench.headline.replace('_', '-')}, on {device}")
        model = inputs.recipes.model if inputs.recipes is not None else None
        written = model.written_precision if model is not None else "fp32"
        if tier in ("reduced", "fp8") and written != "fp32":
            speedup += (f": eager as written computes in {written}; the optimized workload is held to the {tier} "
                        "tier against it")
        elif tier in ("reduced", "fp8") and _lowers_precision(inputs, baselines):
            speedup += f": the optimized workload computes in lower precision (the {tier} tier), eager in fp32"
        elif tier in ("reduced", "fp8"):
            speedup += (f": both compute in fp32 (the {tier} tier allowed lower precision; the optimized workload "
                        "does not use it)")
    frontier, code = None, []
    if baselines is not None and baselines.frontier is not None:
        frontier = baselines.frontier.verdict.split(" Evidence from the speed-of-light floor")[0]
        free = next((r for r in baselines.rows if r.label.endswith("frontier winner")), None)
        if baselines.frontier.recipe and (free is None or free.ci_low <= 1.0):
            code = baselines.frontier.code  # the recipe is the answer (or nothing was benched against it)
    verdict = None
    if validation is not None:
        worst = validation.max_rel_error
        error = f", largest relative error {worst:.2g}" if worst is not None else ""
        verdict = f"{'PASS' if validation.passed else 'FAIL'} in the {validation.tier} tier{error}"
    return SummaryView(slow=slow, chart=_chart(inputs, out_dir), changed=changed, speedup=speedup,
                       frontier=frontier, code=code, validation=verdict)
