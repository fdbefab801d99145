"""One view model per document (report.md, OPTIMIZED_WORKLOAD.md, proposal.md, implementation.md)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field

from mcp_server.children.contract import recipe_parts
from mcp_server.proof.validate import generated_test_path
from mcp_server.render.baselines import BaselinesView, FrontierView, baselines_view
from mcp_server.render.calibration import CalibrationView, calibration_view
from mcp_server.render.inputs import ReportInputs
from mcp_server.render.memory import MemoryView, memory_view
from mcp_server.render.repro import CommandView, optimized_workload_path, plan_commands, report_commands, show_path
from mcp_server.render.summary import SummaryView, summary_view
from mcp_server.render.views import (
    IR_LEVEL_HOW,
    ClockView,
    DeviceView,
    HotspotView,
    ItemView,
    Note,
    OperatorChange,
    ResidualView,
    SpeedupView,
    TotalView,
    ValidationView,
    clock_views,
    consistency_notes,
    device_view,
    diagnosis_text,
    hotspots,
    item_views,
    operator_changes,
    residual_from_analysis,
    residual_views,
    speedup_view,
    totals_view,
    validation_view,
)


class WindowView(BaseModel):
    wall_time_ns: int
    kernel_count: int
    kernel_time_ns: int
    attributed_pct: float | None
    compile_mode: str
    run_mode: str
    iters: int
    gpu_used: bool


class ReportView(BaseModel):
    """report.md."""

    workload: str
    optimized_workload: str | None
    device: DeviceView
    clocks: list[ClockView]
    summary: SummaryView
    speedup: SpeedupView | None
    baselines: BaselinesView | None = None
    validation: ValidationView | None
    calibration: CalibrationView | None = None
    totals: list[TotalView]
    operators: list[OperatorChange]
    applied: list[ItemView]
    not_applied: list[ItemView]
    applied_unplanned: dict[str, int] = Field(default_factory=dict)
    residual: list[ResidualView]
    commands: list[CommandView]
    notes: list[Note]
    files: list[str]
    memory: MemoryView | None = None


class OptimizedWorkloadView(BaseModel):
    """OPTIMIZED_WORKLOAD.md."""

    name: str
    workload: str
    optimized_workload: str
    test_file: str | None = Field(description="Its generated test, where one was written beside it.")
    backend_name: str | None
    recipe: str | None = Field(default=None, description="The free recipe it applies in optimize(model) (its "
                               "RECIPE), instead of a registered backend.")
    compiles: bool = Field(default=True, description="Whether its first call compiles (a recipe in eager mode "
                           "does not).")
    prepares_inputs: bool = Field(default=False, description="Whether it defines prepare_inputs(inputs).")
    applied_passes: dict[str, int]
    items: list[ItemView]
    validation: ValidationView | None
    speedup: SpeedupView | None
    frontier: FrontierView | None = None
    commands: list[CommandView]
    notes: list[Note]


class PlanView(BaseModel):
    """proposal.md and implementation.md."""

    workload: str
    optimized_workload: str
    test_file: str
    backend_name: str
    device: DeviceView
    window: WindowView
    hotspots: list[HotspotView]
    items: list[ItemView]
    rejected: list[ItemView] = Field(default_factory=list)
    not_proposed: list[str]
    tier: str = "exact"
    diagnosis: str | None = None
    opportunities: list[ResidualView] = Field(default_factory=list)
    ir_levels: dict[str, str]
    precision_change: bool
    commands: list[CommandView]


def _window(inputs: ReportInputs) -> WindowView:
    meta, win = inputs.baseline.capture_metadata, inputs.baseline.window
    return WindowView(
        wall_time_ns=win.wall_time_ns, kernel_count=win.kernel_count, kernel_time_ns=win.kernel_time_ns,
        attributed_pct=win.attributed_kernel_time_pct, compile_mode=meta.compile_mode, run_mode=meta.run_mode,
        iters=meta.iters, gpu_used=meta.gpu_used,
    )


def _optimized_workload(inputs: ReportInputs) -> str | None:
    for candidate in (
        inputs.validation.optimized if inputs.validation else None,
        inputs.bench.optimized.workload if inputs.bench else None,
        inputs.optimizations.optimized_workload if inputs.optimizations else None,
        inputs.optimized.capture_metadata.workload if inputs.optimized else None,
        optimized_workload_path(inputs.optimizations.workload) if inputs.optimizations else None,
    ):
        if candidate:
            return candidate
    return None


T = TypeVar("T")


def _shown(loaded: T | None, path: Path | None, project_dir: Path) -> tuple[T, str] | None:
    """A loaded input with its path as the report shows it, when both are there."""
    return (loaded, show_path(path, project_dir)) if loaded is not None and path is not None else None


def _tier(inputs: ReportInputs) -> str:
    """The precision tier the optimized workload claims: the plan's, else the validation's, else exact."""
    if inputs.optimizations is not None:
        return inputs.optimizations.tier
    if inputs.bench_vs_free is not None and inputs.bench_vs_free.tier:
        return inputs.bench_vs_free.tier
    return inputs.validation.tier if inputs.validation is not None else "exact"


def build_report_view(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> ReportView:
    """Everything report.md states, decided from the files."""
    items = item_views(inputs.optimizations, inputs.validation) if inputs.optimizations else []
    planned = {i.pass_name for i in items}
    applied_passes = inputs.validation.applied_passes if inputs.validation else {}
    optimized = _optimized_workload(inputs)
    files = [show_path(p, project_dir) for p in (
        inputs.baseline_path, inputs.optimized_path, inputs.analysis_path, inputs.comparison_path,
        inputs.bench_path, inputs.recipes_path, inputs.bench_vs_free_path, inputs.validation_path,
        inputs.optimizations_path, inputs.memory_path) if p is not None]
    baselines = baselines_view(
        _shown(inputs.bench, inputs.bench_path, project_dir),
        _shown(inputs.bench_vs_free, inputs.bench_vs_free_path, project_dir),
        _shown(inputs.recipes, inputs.recipes_path, project_dir), tier=_tier(inputs),
        floor=inputs.analysis.speed_of_light if inputs.analysis else None,
        applies=inputs.validation.recipe if inputs.validation else None)
    recipe = inputs.validation.recipe if inputs.validation else None
    changed = [f"{i.rank}. {i.title}" for i in items if i.applied] or (
        [f"the frontier's winner, {recipe}, applied as plain code in optimize(model)"] if recipe else [])
    return ReportView(
        summary=summary_view(inputs, baselines, changed, out_dir),
        workload=show_path(inputs.baseline.capture_metadata.workload, project_dir),
        optimized_workload=show_path(optimized, project_dir) if optimized else None,
        device=device_view(inputs.baseline), clocks=clock_views(inputs),
        speedup=speedup_view(inputs.bench) if inputs.bench else None,
        baselines=baselines,
        validation=validation_view(inputs.validation) if inputs.validation else None,
        calibration=calibration_view(inputs.optimizations, inputs.validation, inputs.bench,
                                     inputs.baseline_analysis, inputs.bench_vs_free)
        if inputs.optimizations else None,
        totals=totals_view(inputs.comparison) if inputs.comparison else [],
        operators=operator_changes(inputs.comparison) if inputs.comparison else [],
        applied=[i for i in items if i.applied], not_applied=[i for i in items if not i.applied],
        applied_unplanned={k: v for k, v in applied_passes.items() if k not in planned},
        residual=residual_views(inputs, items), commands=report_commands(inputs, out_dir, project_dir),
        notes=consistency_notes(inputs), files=files,
        memory=memory_view(inputs.memory, inputs.memory_path, project_dir)
        if inputs.memory is not None and inputs.memory_path is not None else None,
    )


def build_optimized_workload_view(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> OptimizedWorkloadView:
    """What OPTIMIZED_WORKLOAD.md states: how to use the optimized workload, what it changes, how it was proven."""
    optimized = _optimized_workload(inputs)
    if optimized is None:
        raise ValueError("OPTIMIZED_WORKLOAD.md needs an optimized workload: pass validation, bench or optimizations")
    commands = [c for c in report_commands(inputs, out_dir, project_dir) if c.argv[1] in ("validate", "bench")]
    notes = [n for n in consistency_notes(inputs) if n.about in ("bench", "validation")]
    recipe = inputs.validation.recipe if inputs.validation else None
    test = generated_test_path(Path(optimized))
    return OptimizedWorkloadView(
        name=Path(optimized).stem, workload=show_path(inputs.baseline.capture_metadata.workload, project_dir),
        optimized_workload=show_path(optimized, project_dir),
        test_file=show_path(test, project_dir) if test.is_file() else None,
        backend_name=inputs.validation.backend_name if inputs.validation else None,
        recipe=recipe, compiles=recipe is None or recipe_parts(recipe)[0] != "eager",
        prepares_inputs=_defines(Path(optimized), "prepare_inputs"),
        applied_passes=inputs.validation.applied_passes if inputs.validation else {},
        items=item_views(inputs.optimizations, inputs.validation) if inputs.optimizations else [],
        validation=validation_view(inputs.validation) if inputs.validation else None,
        speedup=speedup_view(inputs.bench) if inputs.bench else None, frontier=_frontier(inputs, project_dir),
        commands=commands, notes=notes,
    )


def _defines(workload: Path, function: str) -> bool:
    """Whether `workload`'s source defines `function` at its top level (False when it cannot be read or parsed)."""
    try:
        tree = ast.parse(workload.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body)


def _frontier(inputs: ReportInputs, project_dir: Path) -> FrontierView | None:
    """The verdict against the frontier's winner of the tier, when recipes.json was given."""
    view = baselines_view(None, _shown(inputs.bench_vs_free, inputs.bench_vs_free_path, project_dir),
                          _shown(inputs.recipes, inputs.recipes_path, project_dir), tier=_tier(inputs),
                          floor=inputs.analysis.speed_of_light if inputs.analysis else None,
                          applies=inputs.validation.recipe if inputs.validation else None)
    return view.frontier if view is not None else None


def build_plan_view(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> PlanView:
    """What proposal.md and implementation.md state, from the baseline profile and optimizations.json."""
    plan = inputs.optimizations
    if plan is None:
        raise ValueError("proposal.md and implementation.md need optimizations.json")
    commands = plan_commands(inputs, plan, out_dir, project_dir)
    views = item_views(plan)
    optimized = show_path(plan.optimized_workload or optimized_workload_path(plan.workload), project_dir)
    return PlanView(
        workload=show_path(plan.workload, project_dir), optimized_workload=optimized,
        test_file=show_path(generated_test_path(Path(optimized)), project_dir),
        backend_name=f"{Path(plan.workload).stem}_opt", device=device_view(inputs.baseline), window=_window(inputs),
        hotspots=hotspots(inputs.baseline), items=[i for i in views if i.status != "rejected"],
        rejected=[i for i in views if i.status == "rejected"], not_proposed=plan.not_proposed, tier=plan.tier,
        diagnosis=diagnosis_text(inputs.analysis) if inputs.analysis else None,
        opportunities=(residual_from_analysis(inputs.analysis, [], tier=plan.tier, frontier=inputs.recipes)
                       if inputs.analysis else []),
        ir_levels=IR_LEVEL_HOW, commands=commands,
        precision_change=any(i.precision_change for i in plan.items if i.status != "rejected"),
    )
