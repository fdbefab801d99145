"""Warp-stall breakdown per kernel from the stall_* counters, with the cause -> fix table of warp_stalls.yaml.

Each counter is smsp__average_warps_issue_stalled_<reason>_per_issue_active: warps stalled on that reason per
issue-active cycle. Shares are of the reasons collected (plugins/ncu/metrics.yaml holds the main eight), so
they read somewhat higher than Nsight Compute's share of all cycles between issues; the flag follows its
CPIStall rules (issue slots busy < 80 % and the reason > 30 %, thresholds in bottleneck_rules.yaml).
"""

from __future__ import annotations

from mcp_server.analysis.rules import knowledge, rule
from mcp_server.schema.analysis import StallBreakdown
from mcp_server.schema.profile import KernelRecord


def stall_table() -> dict[str, dict]:
    """Reason key -> {name, cause, fix} from knowledge/warp_stalls.yaml."""
    return knowledge("warp_stalls").get("reasons", {})


def stall_name(reason: str) -> str:
    """Human name of a stall counter key (e.g. stall_long_scoreboard -> long scoreboard)."""
    return stall_table().get(reason, {}).get("name", reason.removeprefix("stall_").replace("_", " "))


def stall_breakdown(kernel: KernelRecord) -> StallBreakdown | None:
    """The kernel's stall reasons, their shares and the dominant one (None without stall counters)."""
    table = stall_table()
    per_issue = {k: kernel.metrics[k].value for k in table if k in kernel.metrics}
    total = sum(v for v in per_issue.values() if v > 0)
    if not per_issue or total <= 0:
        return None
    share = {k: 100.0 * max(v, 0.0) / total for k, v in per_issue.items()}
    dominant = max(share, key=share.__getitem__)
    issue = kernel.metrics.get("issue_active_pct")
    issue_pct = issue.value if issue is not None else None
    flagged = share[dominant] > rule("stalls", "dominant_share_pct") and (
        issue_pct is None or issue_pct < rule("stalls", "issue_active_max_pct")
    )
    entry = table.get(dominant, {})
    return StallBreakdown(
        per_issue=per_issue, share_pct=share, dominant=dominant, dominant_share_pct=share[dominant],
        issue_active_pct=issue_pct, flagged=flagged,
        cause=" ".join(str(entry.get("cause", "")).split()) or None,
        fix=" ".join(str(entry.get("fix", "")).split()) or None,
    )
