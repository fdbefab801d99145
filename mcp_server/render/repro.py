"""Reproduction commands: the `operator-profiler` command lines that recreate each file of a report.

Every command is built from what the files themselves record (workload paths, compile mode, iterations,
seeds, interpreter, bench settings), using only subcommands and flags of `mcp_server.cli.build_parser()`, so
it works as printed. Paths under the project directory are printed relative to it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pydantic import BaseModel

from mcp_server.backends.registry import REGISTRY
from mcp_server.proof.bench import bench_file
from mcp_server.proof.validate import TOLERANCE_CLASSES
from mcp_server.render.inputs import ReportInputs
from mcp_server.rundir import RunDir
from mcp_server.schema.flags import cli_flags, flag_of
from mcp_server.schema.optimizations import OptimizationPlan
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.proof import BenchResult, ValidationReport
from mcp_server.schema.recipes import RecipesReport
from mcp_server.schema.requests import (
    BenchRequest,
    CaptureOptions,
    CompareRequest,
    Interpreter,
    ProfileRequest,
    RecipesRequest,
    ReportRequest,
    TimingOptions,
    ValidateRequest,
)

PROGRAM = "operator-profiler"
PYTHON = flag_of(Interpreter, "python")
OUTPUT = flag_of(ProfileRequest, "output")  # every verb's output folder is spelt alike


class CommandView(BaseModel):
    """One command line and what it reproduces."""

    purpose: str
    argv: list[str]

    @property
    def line(self) -> str:
        """The command as a shell line (each argument quoted where needed)."""
        return shlex.join(self.argv)


def show_path(path: str | Path, project_dir: Path) -> str:
    """`path` relative to `project_dir` when it lies under it, else as given (resolved when it exists)."""
    candidate = Path(path)
    absolute = candidate if candidate.is_absolute() else (project_dir / candidate)
    try:
        return str(absolute.resolve().relative_to(project_dir.resolve()))
    except ValueError:
        return str(candidate)


def rerun_dir(profile_path: Path) -> Path:
    """The run directory a re-capture writes: the profile's own run directory (a folder with manifest.json),
    else `<stem>_run/` beside a copied profile (DIR/profile_optimized.json -> DIR/profile_optimized_run/)."""
    run = RunDir(profile_path.parent)
    if profile_path == run.profile_path and run.manifest_path.is_file():
        return run.path
    return profile_path.parent / f"{profile_path.stem}_run"


def profile_command(profile: OperatorAttributedProfile, run_dir: Path, project_dir: Path, purpose: str) -> CommandView:
    """`run` (a backend with counters: nsys + ncu) or `profile --backend NAME`, with the capture settings the profile
    records."""
    meta = profile.capture_metadata
    backend = next((b for b in REGISTRY.values() if b.profile_tool == meta.tool.split("+")[0]), None)
    if backend is not None and backend.counters:
        argv = [PROGRAM, "run", show_path(meta.workload, project_dir)]
    else:
        argv = [PROGRAM, "profile", show_path(meta.workload, project_dir)]
        argv += [flag_of(ProfileRequest, "backend"), backend.name] if backend is not None else []
    for name in ("compile_mode", "warmup_iters", "iters", "seed"):  # the capture settings the profile records
        argv += [flag_of(CaptureOptions, name), str(getattr(meta, name))]
    argv += [PYTHON, meta.python_executable, OUTPUT, show_path(run_dir, project_dir)]
    if meta.run_mode == "train_step":
        argv.append(flag_of(CaptureOptions, "train_step"))
    return CommandView(purpose=purpose, argv=argv)


def bench_command(bench: BenchResult, out_dir: Path, project_dir: Path) -> CommandView:
    """`bench` with the settings bench.json records."""
    timing = TimingOptions(seed=bench.seed, input_sets=bench.input_sets, warmup=bench.warmup, calls=bench.calls,
                           queued=bench.queued, blocks=bench.blocks, budget_s=bench.budget_s,
                           throughput=bench.headline == "back_to_back")
    argv = [PROGRAM, "bench", show_path(bench.baseline.workload, project_dir),
            show_path(bench.optimized.workload, project_dir), PYTHON, bench.python_executable,
            flag_of(BenchRequest, "rounds"), str(bench.rounds), flag_of(BenchRequest, "baseline_mode"),
            bench.baseline_mode, *cli_flags(timing)]
    if bench.baseline_mode == "free":
        argv += [flag_of(BenchRequest, "tier"), bench.tier or "exact"]
        if bench.recipes_path is not None:
            argv += [flag_of(BenchRequest, "recipes"), show_path(bench.recipes_path, project_dir)]
    argv += [OUTPUT, show_path(out_dir, project_dir)]
    against = {"eager": "eager as written", "free": f"the {bench.tier} tier's frontier winner"}.get(
        bench.baseline_mode, bench.baseline_mode)
    return CommandView(purpose=f"time the optimized workload against {against}, each side in its own processes "
                       f"({out_dir.name}/{bench_file(bench.baseline_mode)})", argv=argv)


def recipes_command(recipes: RecipesReport, out_dir: Path, project_dir: Path) -> CommandView:
    """`recipes` with the settings recipes.json records."""
    argv = [PROGRAM, "recipes", show_path(recipes.workload, project_dir), PYTHON, recipes.python_executable,
            flag_of(RecipesRequest, "seeds"), ",".join(map(str, recipes.seeds)),
            *([flag_of(RecipesRequest, "thorough")] if recipes.thorough else []),
            OUTPUT, show_path(out_dir, project_dir)]
    return CommandView(purpose="measure the free frontier on this GPU (recipes.json, frontier.png)", argv=argv)


def validate_command(
    report: ValidationReport, out_dir: Path, project_dir: Path, bench_path: Path | None,
    optimizations: Path | None = None,
) -> CommandView:
    """`validate` with the seeds, tier and tolerances validation_report.json records (and the plan it checked)."""
    argv = [
        PROGRAM, "validate", show_path(report.baseline, project_dir), show_path(report.optimized, project_dir),
        PYTHON, report.python_executable, _validate("seeds"), ",".join(str(s) for s in report.seeds),
        _validate("tier"), report.tier,
    ]
    if optimizations is not None:
        argv += [_validate("optimizations"), show_path(optimizations, project_dir)]
    for name, rtol in sorted(report.tolerances.items()):
        if name not in TOLERANCE_CLASSES:
            continue
        argv += [_validate("tolerances"), f"{name}={rtol:g}"]
    if report.atol_override is not None:
        argv += [_validate("atol"), f"{report.atol_override:g}"]
    if report.max_plausible_speedup is not None:
        argv += [_validate("max_plausible_speedup"), f"{report.max_plausible_speedup:g}"]
    if report.speedup is not None and bench_path is not None:
        argv += [_validate("bench_json"), show_path(bench_path, project_dir)]
    elif report.speedup is not None:
        argv += [_validate("speedup"), f"{report.speedup:g}"]
    argv += [OUTPUT, show_path(out_dir, project_dir)]
    return CommandView(purpose="check the optimized workload against the baseline (validation_report.json)", argv=argv)


def report_command(inputs: ReportInputs, out_dir: Path, project_dir: Path, plan: bool = False) -> CommandView:
    """`report` over the same files."""
    argv = [PROGRAM, "report", show_path(inputs.baseline_path, project_dir)]
    for name, path in (
        ("optimized_profile", inputs.optimized_path), ("analysis", inputs.analysis_path),
        ("baseline_analysis", inputs.baseline_analysis_path),
        ("comparison", inputs.comparison_path), ("bench_json", inputs.bench_path),
        ("recipes", inputs.recipes_path), ("bench_vs_free", inputs.bench_vs_free_path),
        ("validation", inputs.validation_path), ("optimizations", inputs.optimizations_path),
    ):
        if path is not None:
            argv += [flag_of(ReportRequest, name), show_path(path, project_dir)]
    if plan:
        argv.append(flag_of(ReportRequest, "plan"))
    argv += [OUTPUT, show_path(out_dir, project_dir)]
    what = "proposal.md and implementation.md" if plan else "report.md and OPTIMIZED_WORKLOAD.md"
    return CommandView(purpose=f"render {what} again from these files", argv=argv)


def report_commands(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> list[CommandView]:
    """Every step of the loop that produced the report's inputs, in order, then the report itself.

    Re-captured profiles land in `rerun_dir(...)/profile.json`, and the compare command reads those.
    """
    meta = inputs.baseline.capture_metadata
    commands = [CommandView(purpose="check GPU, driver, torch/CUDA, nsys, ncu and counter permission",
                            argv=[PROGRAM, "preflight", PYTHON, meta.python_executable])]
    base_run = rerun_dir(inputs.baseline_path)
    commands.append(profile_command(inputs.baseline, base_run, project_dir, "profile the baseline"))
    if inputs.optimized is not None and inputs.optimized_path is not None:
        opt_run = rerun_dir(inputs.optimized_path)
        commands.append(profile_command(inputs.optimized, opt_run, project_dir, "profile the optimized workload"))
        argv = [PROGRAM, "compare", show_path(RunDir(base_run).profile_path, project_dir),
                show_path(RunDir(opt_run).profile_path, project_dir)]
        if inputs.comparison is not None and inputs.comparison.allow_mismatch:
            argv.append(flag_of(CompareRequest, "allow_mismatch"))
        if inputs.comparison_path is not None:
            argv += [OUTPUT, show_path(inputs.comparison_path.parent, project_dir)]
        commands.append(CommandView(purpose="per-operator deltas of the two profiles above (comparison.json)",
                                    argv=argv))
    if inputs.recipes is not None and inputs.recipes_path is not None:
        commands.append(recipes_command(inputs.recipes, inputs.recipes_path.parent, project_dir))
    proof: list[CommandView] = []
    if inputs.validation is not None and inputs.validation_path is not None:
        proof.append(validate_command(inputs.validation, inputs.validation_path.parent, project_dir,
                                      inputs.bench_path, inputs.optimizations_path))
    if inputs.bench is not None and inputs.bench_path is not None:
        bench = bench_command(inputs.bench, inputs.bench_path.parent, project_dir)
        # validate reads bench.json for its plausibility check, so bench runs first when validate used it.
        uses_bench = inputs.validation is not None and inputs.validation.speedup is not None
        proof = [bench, *proof] if uses_bench else [*proof, bench]
    if inputs.bench_vs_free is not None and inputs.bench_vs_free_path is not None:
        proof.append(bench_command(inputs.bench_vs_free, inputs.bench_vs_free_path.parent, project_dir))
    commands += proof
    commands.append(report_command(inputs, out_dir, project_dir))
    return commands


def plan_commands(
    inputs: ReportInputs, plan: OptimizationPlan, out_dir: Path, project_dir: Path
) -> list[CommandView]:
    """What to run once the plan is implemented: validate, bench, profile, compare; then the report."""
    meta = inputs.baseline.capture_metadata
    baseline = show_path(plan.workload, project_dir)
    optimized = show_path(plan.optimized_workload or optimized_workload_path(plan.workload), project_dir)
    options = [_validate("tier"), plan.tier]  # the reduced tier holds float32 outputs to 1e-2 and records the tier
    if inputs.optimizations_path is not None:  # planned_passes: every implemented item fired its own pass
        options += [_validate("optimizations"), show_path(inputs.optimizations_path, project_dir)]
    folder = show_path(Path(plan.workload).parent, project_dir)
    python = [PYTHON, meta.python_executable]
    return [
        CommandView(purpose="check the optimized workload (validation_report.json)",
                    argv=[PROGRAM, "validate", baseline, optimized, *python, *options, OUTPUT, folder]),
        *(CommandView(purpose=purpose, argv=[PROGRAM, "bench", baseline, optimized, *python,
                                             flag_of(BenchRequest, "baseline_mode"), mode, *extra, OUTPUT, folder])
          for mode, extra, purpose in (
              ("eager", [], "measure the speedup over eager with its interval (bench.json)"),
              ("free", [flag_of(BenchRequest, "tier"), plan.tier],
               f"against the {plan.tier} tier's winner of the free frontier, recipes.json (bench_vs_free.json)"),
          )),
        report_command(inputs, out_dir, project_dir, plan=True),
    ]


def _validate(name: str) -> str:
    return flag_of(ValidateRequest, name)


def optimized_workload_path(workload: str) -> str:
    """`<dir>/<name>_optimized.py` beside the baseline `<dir>/<name>.py`."""
    path = Path(workload)
    return str(path.with_name(f"{path.stem}_optimized.py"))
