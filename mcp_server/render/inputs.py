"""The files a report is rendered from, loaded and validated once.

Only the baseline profile is required. Every other file is optional, and a report says plainly which
ones it had: no bench.json means no speedup is claimed, no validation_report.json means nothing is said to be
right.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mcp_server.proof.bench import load_bench_result, load_recipes
from mcp_server.proof.validate import load_validation_report
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import load_profile, read_model
from mcp_server.schema.optimizations import OptimizationPlan, load_optimizations
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.proof import BenchResult, Comparison, ValidationReport
from mcp_server.schema.recipes import RecipesReport

if TYPE_CHECKING:
    from mcp_server.schema.memory import MemoryProfile


@dataclass
class ReportInputs:
    """Loaded inputs of a report, with the path each came from (for reproduction commands)."""

    baseline: OperatorAttributedProfile
    baseline_path: Path
    optimized: OperatorAttributedProfile | None = None
    optimized_path: Path | None = None
    analysis: Analysis | None = None
    analysis_path: Path | None = None
    baseline_analysis: Analysis | None = None
    baseline_analysis_path: Path | None = None
    comparison: Comparison | None = None
    comparison_path: Path | None = None
    bench: BenchResult | None = None
    bench_path: Path | None = None
    validation: ValidationReport | None = None
    validation_path: Path | None = None
    optimizations: OptimizationPlan | None = None
    optimizations_path: Path | None = None
    # the free frontier measured on the same GPU, and the optimized workload benched against its tier's winner
    recipes: RecipesReport | None = None
    recipes_path: Path | None = None
    bench_vs_free: BenchResult | None = None
    bench_vs_free_path: Path | None = None
    memory: MemoryProfile | None = None  # memory.json beside the baseline profile (a run with a memory pass)
    memory_path: Path | None = None

    def paths(self) -> list[Path]:
        """Every file the documents are rendered from."""
        found = [self.baseline_path, self.optimized_path, self.analysis_path, self.baseline_analysis_path,
                 self.comparison_path, self.bench_path, self.validation_path, self.optimizations_path,
                 self.recipes_path, self.bench_vs_free_path, self.memory_path]
        return [p for p in found if p is not None]


def load_inputs(
    baseline_profile: Path,
    optimized_profile: Path | None = None,
    analysis: Path | None = None,
    comparison: Path | None = None,
    bench: Path | None = None,
    validation: Path | None = None,
    optimizations: Path | None = None,
    baseline_analysis: Path | None = None,
    recipes: Path | None = None,
    bench_vs_free: Path | None = None,
) -> ReportInputs:
    """Load and validate every given file; a missing or malformed file raises ProfileFormatError."""
    inputs = ReportInputs(baseline=load_profile(baseline_profile), baseline_path=Path(baseline_profile))
    memory_path = Path(baseline_profile).parent / "memory.json"  # a run with a memory pass
    if memory_path.is_file():
        from mcp_server.memory.run import load_memory

        inputs.memory, inputs.memory_path = load_memory(memory_path.parent), memory_path
    if optimized_profile is not None:
        inputs.optimized, inputs.optimized_path = load_profile(optimized_profile), Path(optimized_profile)
    if analysis is not None:
        inputs.analysis = read_model(Path(analysis), Analysis, "analysis.json", "run `analyze` on the profile")
        inputs.analysis_path = Path(analysis)
    if comparison is not None:
        inputs.comparison = read_model(
            Path(comparison), Comparison, "comparison.json", "run `operator-profiler compare` on the two profiles"
        )
        inputs.comparison_path = Path(comparison)
    if bench is not None:
        inputs.bench, inputs.bench_path = load_bench_result(Path(bench)), Path(bench)
    if recipes is not None:
        inputs.recipes, inputs.recipes_path = load_recipes(Path(recipes)), Path(recipes)
    if bench_vs_free is not None:
        inputs.bench_vs_free, inputs.bench_vs_free_path = load_bench_result(Path(bench_vs_free)), Path(bench_vs_free)
    if validation is not None:
        inputs.validation, inputs.validation_path = load_validation_report(Path(validation)), Path(validation)
    if optimizations is not None:
        inputs.optimizations, inputs.optimizations_path = load_optimizations(Path(optimizations)), Path(optimizations)
        if baseline_analysis is None and inputs.optimizations.analysis:  # the analysis the plan was drawn from
            consulted = Path(inputs.optimizations.analysis)
            for candidate in (consulted, Path(optimizations).parent / consulted):
                if candidate.is_file() and candidate != inputs.analysis_path:
                    baseline_analysis = candidate
                    break
    if baseline_analysis is not None:
        inputs.baseline_analysis = read_model(Path(baseline_analysis), Analysis, "analysis.json",
                                              "run `analyze` on the baseline profile")
        inputs.baseline_analysis_path = Path(baseline_analysis)
    return inputs
