"""The engine's facade: one function per verb, a typed request in, a schema model out.

The CLI (`cli.py`) and the MCP server (`serve/app.py`) are faces over these functions: they parse arguments or
MCP parameters into the request, show progress, and print or return the result. Every verb has the signature
`verb(request, progress=quiet, cancel=None)`; `progress` receives phase lines and children's output, and setting
`cancel` stops any child the verb started (CancelledCapture). Imports of the heavier stages (analysis's charts,
Jinja2's templates, the memory pass's replay) happen inside the verbs that need them.
"""

from mcp_server.api.capture import assemble, map_run, memory, profile
from mcp_server.api.documents import report
from mcp_server.api.loop import loop_status
from mcp_server.api.machine import preflight
from mcp_server.api.optimize import optimize
from mcp_server.api.proof import bench, recipes, validate
from mcp_server.api.reading import analyze, compare, kernel_detail, operator_detail, summary

__all__ = [
    "analyze", "assemble", "bench", "compare", "kernel_detail", "loop_status", "map_run", "memory",
    "operator_detail", "optimize", "preflight", "profile", "recipes", "report", "summary", "validate",
]
