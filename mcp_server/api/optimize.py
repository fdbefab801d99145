"""optimize: the floor in one command, with no language model involved.

Profile the workload (on a GPU with nsys and ncu: with counters) and analyse it, measure its free frontier, write the
tier's winner as `<name>_optimized.py` (plain code in optimize(model)), bench it against eager and against the winner
(each side in its own processes), validate it with the bench's speedup and the analysis's speed of light, profile and
analyse the optimized workload, compare the two profiles, and render report.md and OPTIMIZED_WORKLOAD.md. Every file
goes under the output folder, nothing beside the user's workload. A stage that fails stops the verb with the stage's
name; the files of the stages before it stay.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mcp_server.api.capture import profile
from mcp_server.api.common import Cancel
from mcp_server.api.documents import report
from mcp_server.api.proof import bench, recipes, validate
from mcp_server.api.reading import analyze, compare
from mcp_server.backends.registry import AUTO, choose_backend
from mcp_server.children.contract import recipe_parts
from mcp_server.compare import ProfileMismatch
from mcp_server.errors import ProfilerError, UsageError
from mcp_server.progress import Progress, quiet
from mcp_server.proof import check_workload
from mcp_server.proof.bench import check_frontier_of, load_recipes
from mcp_server.proof.recipes import RECIPES_JSON, unstable_reference
from mcp_server.render.recipe_workload import write_recipe_workload
from mcp_server.rundir import files_under, output_folder
from mcp_server.schema.recipes import RUNOFF_ROUNDS, RecipesReport, Winner
from mcp_server.schema.requests import (
    AnalyzeRequest,
    BenchRequest,
    CaptureOptions,
    CompareRequest,
    NcuOptions,
    OptimizeRequest,
    ProfileRequest,
    RecipesRequest,
    RecipeTiming,
    ReportRequest,
    ValidateRequest,
)
from mcp_server.schema.results import BenchToolResult, OptimizeResult

STAGES = ("profile", "recipes", "write", "bench", "validate", "reprofile", "compare", "report")
T = TypeVar("T")


class _Stages:
    """Runs the stages in order, announcing each; a failure names the stage it stopped at."""

    def __init__(self, progress: Progress) -> None:
        self.progress, self.done = progress, list[str]()

    def __call__(self, label: str, work: Callable[[], T]) -> T:
        self.progress(f"optimize: [{len(self.done) + 1}/{len(STAGES)}] {label}")
        try:
            found = work()
        except ProfilerError as exc:
            raise type(exc)(f"optimize stopped at {label}: {exc.message}", exc.remedy) from exc
        self.done.append(label)
        return found


def optimize(req: OptimizeRequest, progress: Progress = quiet, cancel: Cancel = None) -> OptimizeResult:
    """The floor: the tier's winner of the free frontier as an optimized workload, validated, benched, profiled and
    reported, every file in one folder."""
    check_workload(req.workload)  # before any folder is made: every stage needs the contract's model
    given: RecipesReport | None = None
    if req.recipes is not None:  # a frontier of another workload, or without a winner, is refused before profiling
        given = check_frontier_of(load_recipes(req.recipes), req.recipes, req.workload)
        _winner(given, req, req.recipes)
    out = output_folder(req.output, req.project, req.workload, "optimize")
    out.mkdir(parents=True, exist_ok=True)
    counters = choose_backend(AUTO).counters
    stage = _Stages(progress)
    warnings: list[str] = []

    def capture(workload: Path, mode: str, name: str) -> Path:
        """Profile `workload` under compile mode `mode` into out/runs/`name`, analyse it into out/analysis_`name`;
        its analysis.json (the profile is copied to out/<profile.json or profile_optimized.json>)."""
        run = profile(ProfileRequest(
            workload=workload, python=req.python, project=req.project, require_counters=False,
            capture=CaptureOptions(compile_mode=mode, timeout_s=req.timeout_s),  # type: ignore[arg-type]
            ncu=NcuOptions() if counters else None, output=out / "runs" / name), progress, cancel)
        copied = out / ("profile.json" if name == "baseline" else f"profile_{name}.json")
        shutil.copyfile(run.profile_path, copied)
        warnings.extend(run.warnings)
        return Path(analyze(AnalyzeRequest(profile=copied, output=out / f"analysis_{name}", project=req.project),
                            progress, cancel).analysis_path)

    analysis = stage("profile", lambda: capture(req.workload, "eager", "baseline"))
    recipes_path = req.recipes if req.recipes is not None else out / RECIPES_JSON
    if req.recipes is None:
        stage("recipes", lambda: recipes(RecipesRequest(
            workload=req.workload, python=req.python, thorough=req.thorough, output=out, project=req.project,
            timing=RecipeTiming(runoff=RUNOFF_ROUNDS, throughput=req.timing.throughput), timeout_s=req.timeout_s),
            progress, cancel, runoff_tiers=(req.tier,)))
    else:
        stage("recipes", lambda: progress(f"optimize: the frontier of {recipes_path}, measured earlier"))
    frontier = given or load_recipes(recipes_path)  # read once when given
    winner = _winner(frontier, req, recipes_path)
    optimized = stage("write", lambda: write_recipe_workload(req.workload, winner, frontier, recipes_path, out))

    def timed(mode: str) -> BenchToolResult:
        return bench(BenchRequest(baseline=req.workload, optimized=optimized, python=req.python, timing=req.timing,
                                  baseline_mode=mode, tier=req.tier, recipes=recipes_path, output=out,
                                  project=req.project, timeout_s=req.timeout_s), progress, cancel)

    vs_eager, vs_winner = stage("bench", lambda: (timed("eager"), timed("free")))
    verdict = stage("validate", lambda: validate(ValidateRequest(
        baseline=req.workload, optimized=optimized, python=req.python, tier=req.tier, run_tests=False,
        bench_json=out / "bench.json", analysis=analysis, output=out, project=req.project,
        timeout_s=req.timeout_s), progress, cancel))
    optimized_analysis = stage("reprofile", lambda: capture(optimized, "optimized", "optimized"))
    comparison = stage("compare", lambda: _compared(out, req, progress, cancel, warnings))
    written = stage("report", lambda: report(ReportRequest(
        baseline_profile=out / "profile.json", optimized_profile=out / "profile_optimized.json",
        analysis=optimized_analysis, baseline_analysis=analysis, comparison=comparison,
        bench_json=out / "bench.json", recipes=recipes_path, bench_vs_free=out / "bench_vs_free.json",
        validation=out / "validation_report.json", output=out, project=req.project), progress, cancel))
    summary = (f"{optimized.name} applies {winner.recipe}, the {req.tier} tier's winner of the free frontier; "
               f"validation {'PASS' if verdict.passed else 'FAIL'}; {vs_eager.summary}; against the winner in its own "
               f"processes: {vs_winner.speedup.point:.3f}× ({_versus_winner(winner.recipe)}); "
               f"report: {written.report_path}")
    return OptimizeResult(
        out_dir=str(out), files=files_under(out), summary=summary, tier=req.tier, recipe=winner.recipe,
        optimized_workload=str(optimized), report_path=written.report_path, validation_passed=verdict.passed,
        speedup_vs_eager=vs_eager.speedup, speedup_vs_winner=vs_winner.speedup, stages=stage.done,
        warnings=list(dict.fromkeys(warnings + vs_eager.warnings + verdict.warnings)),
    )


def _winner(frontier: RecipesReport, req: OptimizeRequest, path: Path) -> Winner:
    """The tier's winner of `frontier` (the recipes.json at `path`) by the headline metric, or UsageError saying why
    none validated where the frontier knows (its reference does not reproduce itself)."""
    winner = frontier.winner(req.tier, req.timing.headline)
    if winner is None:
        unstable = unstable_reference(frontier.results, frontier.model)
        raise UsageError(f"optimize stopped at recipes: no recipe of {path} validated in the {req.tier} tier"
                         + (f": {unstable[0]}" if unstable else ""),
                         "fix the workload, then run optimize again" if unstable
                         else "choose the other tier, or read recipes.json for why each recipe failed")
    return winner


def _compared(out: Path, req: OptimizeRequest, progress: Progress, cancel: Cancel, warnings: list[str]) -> Path | None:
    """comparison.json of the two profiles, or None (and a warning) when compare refuses the pair."""
    try:
        compare(CompareRequest(baseline=out / "profile.json", optimized=out / "profile_optimized.json", output=out,
                               project=req.project), progress, cancel)
    except ProfileMismatch as exc:
        warnings.append(f"no comparison: {exc.one_line()}")
        return None
    return out / "comparison.json"


def _versus_winner(recipe: str) -> str:
    """What the optimized workload differs in from the winner it is benched against."""
    _, precision, channels_last, _ = recipe_parts(recipe)
    if precision.endswith("-cast") or channels_last:
        return ("the winner's code, its inputs converted once by prepare_inputs as the recipe's were: the difference "
                "is the measurement's spread; a caller holding the baseline's inputs converts each batch itself")
    return "the same code twice: the difference is the measurement's spread"
