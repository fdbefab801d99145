"""Generated test of sdpa_attention_optimized.py (the template in docs/optimized-workload-contract.md)."""

from __future__ import annotations

import json
from pathlib import Path

import sdpa_attention as baseline
import sdpa_attention_optimized as optimized
import torch


def test_it_applies_the_tiers_winner() -> None:
    recipes = json.loads((Path(__file__).parent / "recipes.json").read_text())
    winner = next(w for w in recipes["winners"] if w["tier"] == "reduced" and w["metric"] == "latency")
    assert winner["recipe"] == optimized.RECIPE


def test_matches_baseline_and_applies_its_passes() -> None:
    torch.manual_seed(0)
    base_model, inputs = baseline.get_model_and_input()
    torch.manual_seed(0)
    model, _ = optimized.get_model_and_input()
    model.load_state_dict(base_model.state_dict())
    compiled = optimized.optimize(model)
    with torch.no_grad():
        expected = base_model(*inputs)
        got = compiled(*optimized.prepare_inputs(inputs))
    # reduced tier: the whole model in float16 (the tier's winner in recipes.json), compared at the reduced tier's
    # tolerance
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    assert optimized.APPLIED_PASSES.get("fp16_weights", 0) >= 1
