"""The machine verb: preflight."""

from __future__ import annotations

import re

from mcp_server.api.common import Cancel
from mcp_server.preflight import format_report
from mcp_server.preflight import preflight as check_machine
from mcp_server.progress import Progress, quiet
from mcp_server.schema.requests import (
    PreflightRequest,
)
from mcp_server.schema.results import (
    InterpreterInfo,
    PreflightResult,
)

TORCH_VERSION = re.compile(r"^torch (\S+)")
def preflight(req: PreflightRequest, progress: Progress = quiet, cancel: Cancel = None) -> PreflightResult:
    """GPU, driver, torch/CUDA under the chosen interpreter, nsys, ncu and counter permission."""
    progress(f"preflight: checking this machine and {req.python.python}")
    found = check_machine(req.python.python, quick=req.quick)
    torch_check = next((c for c in found.checks if c.name == "torch"), None)
    version = TORCH_VERSION.match(torch_check.detail) if torch_check is not None and torch_check.detail else None
    return PreflightResult(
        ok=found.ok, checks=found.checks, backend=found.backend, summary=format_report(found),
        interpreter=InterpreterInfo(python=req.python.python, source=req.python.source,
                                    torch_version=version.group(1) if version else None),
    )
