"""The documents verb: report.md and OPTIMIZED_WORKLOAD.md, or the plan's proposal.md and implementation.md."""

from __future__ import annotations

from pathlib import Path

from mcp_server.api.common import Cancel, record
from mcp_server.errors import UsageError
from mcp_server.loop import Recorder
from mcp_server.progress import Progress, quiet
from mcp_server.proof.evidence import disagreements
from mcp_server.rundir import dropped_if_empty, output_folder, profile_file
from mcp_server.schema.requests import ReportRequest
from mcp_server.schema.results import ReportResult


def report(req: ReportRequest, progress: Progress = quiet, cancel: Cancel = None) -> ReportResult:
    """Render report.md (and OPTIMIZED_WORKLOAD.md), or with `plan` proposal.md and implementation.md."""
    from mcp_server.render import load_inputs, write_plan, write_report  # Jinja2 and the templates: only here

    base = profile_file(req.baseline_profile)
    optimized = profile_file(req.optimized_profile) if req.optimized_profile else None
    if req.plan and req.optimizations is None:
        raise UsageError("plan mode needs optimizations", "pass the optimizations.json the strategist wrote")
    if req.plan:
        inputs = load_inputs(base, analysis=req.analysis, optimizations=req.optimizations)
        wrong = disagreements(inputs.optimizations, inputs.baseline) if inputs.optimizations else []
        if wrong:
            raise UsageError(f"optimizations.json quotes values profile.json does not hold: {'; '.join(wrong[:5])}",
                             "quote the profile's own values (top_operators, operator_detail, kernel_detail) and "
                             "render the plan again")
    else:
        inputs = load_inputs(base, optimized, analysis=req.analysis, comparison=req.comparison, bench=req.bench_json,
                             validation=req.validation, optimizations=req.optimizations,
                             baseline_analysis=req.baseline_analysis, recipes=req.recipes,
                             bench_vs_free=req.bench_vs_free)
    workloads = [p.capture_metadata.workload for p in (inputs.baseline, inputs.optimized) if p is not None]
    with dropped_if_empty(output_folder(req.output, req.project, Path(workloads[0]), "report")) as out:
        progress(f"report: rendering into {out}")
        loop = Recorder(out, "report", inputs.paths(), workloads)
        written = (write_plan if req.plan else write_report)(inputs, out, req.project)
        main = "proposal.md" if req.plan else "report.md"
        record(loop, written, progress)
    by_name = {p.name: str(p) for p in written}
    return ReportResult(report_path=by_name.get(main, str(out / main)),
                        optimized_workload_path=by_name.get("OPTIMIZED_WORKLOAD.md"), out_dir=str(out),
                        files=[str(p) for p in written])
