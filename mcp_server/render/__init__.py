"""Render the loop's documents (report.md, OPTIMIZED_WORKLOAD.md, proposal.md, implementation.md) from its files."""

from mcp_server.render.inputs import ReportInputs, load_inputs
from mcp_server.render.render import render_plan, render_report, write_plan, write_report

__all__ = ["ReportInputs", "load_inputs", "render_plan", "render_report", "write_plan", "write_report"]
