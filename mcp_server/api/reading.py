"""Reading verbs: a profile's summary and details, its analysis, and two profiles compared."""

from __future__ import annotations

from pathlib import Path

from mcp_server.api.common import Cancel, record
from mcp_server.compare import compare_paths
from mcp_server.loop import Recorder
from mcp_server.progress import Progress, quiet
from mcp_server.queries import header, top_operators_result
from mcp_server.queries import kernel_detail as kernel_query
from mcp_server.queries import operator_detail as operator_query
from mcp_server.render.comparison import summary_line as compare_line
from mcp_server.render.comparison import write_comparison
from mcp_server.rundir import RANK_FOLDER, RANKS, RunDir, dropped_if_empty, files_under, output_folder, profile_file
from mcp_server.schema.io import load_profile, read_model
from mcp_server.schema.ranks import RanksSummary
from mcp_server.schema.requests import (
    AnalyzeRequest,
    CompareRequest,
    KernelDetailRequest,
    OperatorDetailRequest,
    SummaryRequest,
)
from mcp_server.schema.results import (
    AnalyzeResult,
    CompareResult,
    KernelDetail,
    OperatorDetail,
    TopOperatorsResult,
)


def summary(req: SummaryRequest, progress: Progress = quiet, cancel: Cancel = None) -> TopOperatorsResult:
    """The window and the heaviest operators of a profile; its memory section when memory.json lies beside it."""
    path = profile_file(req.profile)
    result = top_operators_result(path, req.top)
    memory_path = RunDir(path.parent).memory_path
    if memory_path.is_file():
        from mcp_server.memory.run import load_memory
        from mcp_server.memory.text import memory_lines

        found = load_memory(path.parent)
        result.memory = "\n".join(memory_lines(found, memory_path)) if found is not None else None
    return result
def operator_detail(req: OperatorDetailRequest, progress: Progress = quiet, cancel: Cancel = None) -> OperatorDetail:
    """One operator call: module path, shapes, fused operators, its kernels and their counters."""
    return operator_query(profile_file(req.profile), req.operator_id, req.max_kernels)
def kernel_detail(req: KernelDetailRequest, progress: Progress = quiet, cancel: Cancel = None) -> KernelDetail:
    """One kernel launch with every counter, its attribution and the launches sharing its counters."""
    return kernel_query(profile_file(req.profile), req.kernel_id)
def analyze(req: AnalyzeRequest, progress: Progress = quiet, cancel: Cancel = None) -> AnalyzeResult:
    """Diagnose a profile: analysis.json, trace.json and charts."""
    from mcp_server.analysis import analyze_profile, format_summary  # charts import matplotlib: only here

    path = profile_file(req.profile)
    loaded = load_profile(path)
    workload = Path(loaded.capture_metadata.workload)
    with dropped_if_empty(output_folder(req.output, req.project, workload, "analysis")) as out:
        progress(f"analyze: {path}")
        ranks = _ranks_of(path, progress)
        loop = Recorder(out, "analyze", [path, ranks[1] if ranks else None], [workload])
        analysis = analyze_profile(loaded, out, profile_path=path.resolve(), measure=req.measure, ranks=ranks)
        record(loop, [analysis.artifacts.get("analysis.json", out / "analysis.json")], progress)
    return AnalyzeResult(
        analysis_path=analysis.artifacts.get("analysis.json", str(out / "analysis.json")), out_dir=str(out),
        files=files_under(out), summary=format_summary(analysis), profile=header(loaded, path),
        configuration=analysis.configuration, gpu_data=analysis.gpu_data, counters=analysis.counters,
        diagnosis=analysis.diagnosis, stages=analysis.stages, opportunities=analysis.opportunities,
        findings=analysis.findings, cpu_hotspots=analysis.cpu_hotspots, timeline=analysis.timeline,
        notes=analysis.notes, speed_of_light=analysis.speed_of_light, distributed=analysis.distributed,
    )
def _ranks_of(profile: Path, progress: Progress) -> tuple[RanksSummary, Path] | None:
    """ranks.json of the multi-rank run a rank's profile.json belongs to (`RUN/rank<R>/profile.json`), if any."""
    if not RANK_FOLDER.match(profile.parent.name):
        return None
    path = RunDir(profile.parent.parent).ranks_path
    if not path.is_file():
        return None
    progress(f"analyze: the multi-rank view from {path}")
    return read_model(path, RanksSummary, RANKS, "re-run `assemble` on the run directory"), path
def compare(req: CompareRequest, progress: Progress = quiet, cancel: Cancel = None) -> CompareResult:
    """Compare two profiles: comparison.json and comparison.md."""
    base, opt = profile_file(req.baseline), profile_file(req.optimized)
    progress(f"compare: {base} against {opt}")
    comparison = compare_paths(base, opt, req.allow_mismatch)
    with dropped_if_empty(output_folder(req.output, req.project, Path(comparison.optimized.workload),
                                        "compare")) as out:
        loop = Recorder(out, "compare", [base, opt], [comparison.baseline.workload, comparison.optimized.workload])
        json_path, md_path = write_comparison(comparison, out)
        record(loop, [json_path, md_path], progress)
    moved = sorted(comparison.operators, key=lambda d: abs(d.time_delta_ns), reverse=True)
    return CompareResult(
        comparison_path=str(json_path), markdown_path=str(md_path), files=files_under(out),
        summary=compare_line(comparison), time_basis=comparison.time_basis, baseline=comparison.baseline,
        optimized=comparison.optimized, totals=comparison.totals, match_counts=comparison.match_counts,
        operator_deltas=moved[:req.top], operator_delta_count=len(moved), new_casts=comparison.new_casts,
        mismatches=comparison.mismatches, warnings=comparison.warnings,
    )
