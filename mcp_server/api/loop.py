"""The loop verb: which stage of the optimization loop is next."""

from __future__ import annotations

from mcp_server.api.common import Cancel
from mcp_server.loop import loop_status as judge_loop
from mcp_server.progress import Progress, quiet
from mcp_server.schema.requests import (
    LoopStatusRequest,
)
from mcp_server.schema.results import (
    LoopStatusResult,
)


def loop_status(req: LoopStatusRequest, progress: Progress = quiet, cancel: Cancel = None) -> LoopStatusResult:
    """Where the optimization loop on a workload stands: each stage done, missing, stale or failed; the next
    stage and the `--from=` value to resume with."""
    return judge_loop(req.workload)
