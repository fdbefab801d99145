"""A plan's evidence read back from the profile it quotes: the examples' H100 plans hold, made-up values do not."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from mcp_server import api
from mcp_server.errors import UsageError
from mcp_server.proof.evidence import disagreements
from mcp_server.schema.io import load_profile
from mcp_server.schema.optimizations import TriggerMetric, load_optimizations
from mcp_server.schema.requests import ReportRequest

EXAMPLES = REPO / "examples"
FOLDERS = sorted(p.parent for p in EXAMPLES.glob("*/optimizations.json"))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_the_examples_plans_quote_their_profiles(folder: Path) -> None:
    assert disagreements(load_optimizations(folder / "optimizations.json"), load_profile(folder / "profile.json")) == []


def test_made_up_values_are_named_with_what_the_profile_holds() -> None:
    folder = EXAMPLES / "mlp_activations"
    plan, profile = load_optimizations(folder / "optimizations.json"), load_profile(folder / "profile.json")
    linear = next(op for op in profile.operators if op.operator_name == "aten::linear")
    item = plan.items[0]
    forged = [
        TriggerMetric(metric="compile_mode", value=0),  # the capture's setting, a word: not a number
        TriggerMetric(metric="total_duration_ns", value=1.0, source=linear.operator_id),
        TriggerMetric(metric="kernel_count", value=profile.window.kernel_count),  # true: not reported
        TriggerMetric(metric="stall_anything", value=3.0, source="analysis.json"),  # not the profile's: not checked
    ]
    plan.items[0] = item.model_copy(update={"evidence": forged})
    found = disagreements(plan, profile)
    assert found == [
        f"item {item.id}: compile_mode=0, but the profile's compile_mode is 'eager', not a number",
        f"item {item.id}: total_duration_ns=1 at {linear.operator_id}, but the profile says "
        f"{linear.aggregated.total_duration_ns:g}",
    ]


def test_plan_mode_refuses_a_plan_the_profile_contradicts(tmp_path: Path) -> None:
    folder = EXAMPLES / "mlp_activations"
    plan = load_optimizations(folder / "optimizations.json")
    plan.items[0] = plan.items[0].model_copy(update={"evidence": [TriggerMetric(metric="compile_mode", value=0)]})
    path = tmp_path / "optimizations.json"
    path.write_text(plan.model_dump_json())
    with pytest.raises(UsageError, match="quotes values profile.json does not hold: item .*compile_mode=0"):
        api.report(ReportRequest(baseline_profile=folder / "profile.json", optimizations=path, plan=True,
                                 output=tmp_path / "out", project=tmp_path))
    assert not (tmp_path / "out").exists()
