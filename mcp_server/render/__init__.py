"""Render the loop's documents (report.md, OPTIMIZED_WORKLOAD.md, proposal.md, implementation.md) from its files."""

from mcp_server.render.render import render_plan, render_report

__all__ = ["render_plan", "render_report"]
