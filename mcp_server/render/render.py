"""Render the documents: one Jinja2 template per document (in prompts/), fed one view model each.

`render_report` writes report.md and OPTIMIZED_WORKLOAD.md; `render_plan` writes proposal.md and
implementation.md. Both load their inputs through `load_inputs`, so a malformed file fails with a remedy
before anything is written, and both write atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from mcp_server.compare.matching import absorbed_summary
from mcp_server.data import data_dir
from mcp_server.errors import ProfileFormatError
from mcp_server.render.comparison import fmt_bytes as _fmt_bytes
from mcp_server.render.comparison import fmt_ns as _fmt_ns
from mcp_server.render.comparison import fmt_ratio as _fmt_ratio
from mcp_server.render.documents import build_optimized_workload_view, build_plan_view, build_report_view
from mcp_server.render.inputs import ReportInputs, load_inputs
from mcp_server.schema.io import write_text_atomic

REPORT_MD = "report.md"
OPTIMIZED_WORKLOAD_MD = "OPTIMIZED_WORKLOAD.md"
PROPOSAL_MD = "proposal.md"
IMPLEMENTATION_MD = "implementation.md"
TEMPLATES = {
    REPORT_MD: "report.md.j2",
    OPTIMIZED_WORKLOAD_MD: "OPTIMIZED_WORKLOAD.md.j2",
    PROPOSAL_MD: "proposal.md.j2",
    IMPLEMENTATION_MD: "implementation.md.j2",
}


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _cell(value: Any) -> str:
    """Text safe inside a markdown table cell."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def environment(prompts_dir: Path | None = None) -> jinja2.Environment:
    """The Jinja2 environment of the templates (the package's prompts/ by default): strict (an unknown name is
    an error), markdown filters."""
    prompts_dir = prompts_dir or data_dir("prompts")
    if not prompts_dir.is_dir():
        raise ProfileFormatError(f"templates not found: {prompts_dir}", "reinstall operator-profiler")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(prompts_dir)), undefined=jinja2.StrictUndefined, autoescape=False,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    env.filters.update(ns=_fmt_ns, bytes=_fmt_bytes, ratio=_fmt_ratio, num=_num, cell=_cell, absorbed=absorbed_summary)
    return env


def render_template(name: str, view: Any, env: jinja2.Environment | None = None) -> str:
    """One template rendered from one view model (its fields are the template's names)."""
    env = env or environment()
    return env.get_template(name).render(**dict(view))


def _write(out_dir: Path, documents: dict[str, str]) -> list[Path]:
    paths = []
    for filename, text in documents.items():
        path = Path(out_dir) / filename
        write_text_atomic(path, text)
        paths.append(path)
    return paths


def report_documents(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> dict[str, str]:
    """report.md and, when an optimized workload is known, OPTIMIZED_WORKLOAD.md, as text."""
    env = environment()
    documents = {REPORT_MD: render_template(TEMPLATES[REPORT_MD], build_report_view(inputs, out_dir, project_dir), env)}
    if inputs.validation is not None or inputs.bench is not None or inputs.optimizations is not None:
        view = build_optimized_workload_view(inputs, out_dir, project_dir)
        documents[OPTIMIZED_WORKLOAD_MD] = render_template(TEMPLATES[OPTIMIZED_WORKLOAD_MD], view, env)
    return documents


def plan_documents(inputs: ReportInputs, out_dir: Path, project_dir: Path) -> dict[str, str]:
    """proposal.md and implementation.md, as text."""
    env = environment()
    view = build_plan_view(inputs, out_dir, project_dir)
    return {name: render_template(TEMPLATES[name], view, env) for name in (PROPOSAL_MD, IMPLEMENTATION_MD)}


def render_report(
    baseline_profile: Path,
    out_dir: Path,
    optimized_profile: Path | None = None,
    analysis: Path | None = None,
    comparison: Path | None = None,
    bench: Path | None = None,
    validation: Path | None = None,
    optimizations: Path | None = None,
    project_dir: Path | None = None,
    baseline_analysis: Path | None = None,
    recipes: Path | None = None,
    bench_vs_free: Path | None = None,
) -> list[Path]:
    """Write report.md (and OPTIMIZED_WORKLOAD.md when validation, bench or optimizations are given) into
    `out_dir`; return the paths written. Paths in the documents are shown relative to `project_dir` (default:
    the current directory). The speedup stated is bench.json's, never a sum of kernel durations."""
    inputs = load_inputs(baseline_profile, optimized_profile, analysis, comparison, bench, validation, optimizations,
                         baseline_analysis, recipes, bench_vs_free)
    return write_report(inputs, out_dir, project_dir)


def render_plan(
    baseline_profile: Path,
    optimizations: Path,
    out_dir: Path,
    analysis: Path | None = None,
    project_dir: Path | None = None,
) -> list[Path]:
    """Write proposal.md and implementation.md from the baseline profile and optimizations.json into `out_dir`."""
    inputs = load_inputs(baseline_profile, analysis=analysis, optimizations=optimizations)
    return write_plan(inputs, out_dir, project_dir)


def write_report(inputs: ReportInputs, out_dir: Path, project_dir: Path | None = None) -> list[Path]:
    """`render_report` of inputs already loaded: report.md (and OPTIMIZED_WORKLOAD.md) written into `out_dir`."""
    return _write(out_dir, report_documents(inputs, Path(out_dir), Path(project_dir or Path.cwd())))


def write_plan(inputs: ReportInputs, out_dir: Path, project_dir: Path | None = None) -> list[Path]:
    """`render_plan` of inputs already loaded: proposal.md and implementation.md written into `out_dir`."""
    return _write(out_dir, plan_documents(inputs, Path(out_dir), Path(project_dir or Path.cwd())))
