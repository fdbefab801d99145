"""optimizations.json's evidence held to the profile it quotes: every value it can be read back is read back.

A plan's item cites trigger metrics (`metric=value` at `source`). Where the metric names something profile.json holds
(an operator's `aggregated` field, a kernel's counter or field, a window total, a capture setting), the value must be
the profile's, within rounding; a number made up, or a name the profile spells with a value of another kind, is
refused before the plan is rendered. Metrics the profile does not hold (read from analysis.json, say) are not checked.
"""

from __future__ import annotations

from typing import Any

from mcp_server.schema.optimizations import OptimizationPlan, TriggerMetric
from mcp_server.schema.profile import OperatorAttributedProfile

RELATIVE, ABSOLUTE = 0.05, 0.05  # rounding an agent may apply when it quotes a value


def _number(found: Any) -> float | None:
    return float(found) if isinstance(found, (int, float)) and not isinstance(found, bool) else None


def _read(evidence: TriggerMetric, profile: OperatorAttributedProfile) -> tuple[bool, Any]:
    """(found, value) of the evidence's metric where the profile holds it."""
    source, metric = evidence.source, evidence.metric
    if source and source.startswith("kernel:"):
        kernels = {str(k.kernel_id): k for op in profile.operators for k in op.kernels}
        kernels.update({str(k.kernel_id): k for k in profile.unattributed_kernels})
        kernel = kernels.get(source.removeprefix("kernel:"))
        if kernel is None:
            return False, None
        if metric in kernel.metrics:
            return True, kernel.metrics[metric]
        return (True, getattr(kernel, metric)) if metric in type(kernel).model_fields else (False, None)
    operator = next((op for op in profile.operators if op.operator_id == source), None) if source else None
    if operator is not None:
        if metric in type(operator.aggregated).model_fields:
            return True, getattr(operator.aggregated, metric)
        return (True, getattr(operator, metric)) if metric in type(operator).model_fields else (False, None)
    if source not in (None, "", "profile.json", "window"):
        return False, None  # analysis.json, or an operator this profile does not hold: not checked here
    for holder in (profile.window, profile.capture_metadata):
        if metric in type(holder).model_fields:
            return True, getattr(holder, metric)
    return False, None


def disagreements(plan: OptimizationPlan, profile: OperatorAttributedProfile) -> list[str]:
    """Each evidence value of the plan's items that the profile contradicts, as one line naming item and source."""
    found: list[str] = []
    for item in plan.items:
        for evidence in item.evidence:
            held, actual = _read(evidence, profile)
            if not held or actual is None:
                continue
            where = f"item {item.id}: {evidence.metric}={evidence.value:g}" + (
                f" at {evidence.source}" if evidence.source else "")
            number = _number(actual)
            if number is None:
                found.append(f"{where}, but the profile's {evidence.metric} is {actual!r}, not a number")
            elif abs(evidence.value - number) > max(RELATIVE * abs(number), ABSOLUTE):
                found.append(f"{where}, but the profile says {number:g}")
    return found
