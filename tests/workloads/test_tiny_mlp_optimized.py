"""Generated test of tiny_mlp_optimized.py (the template in docs/optimized-workload-contract.md)."""

from __future__ import annotations

import tiny_mlp as baseline
import tiny_mlp_optimized as optimized
import torch


def test_backend_is_registered() -> None:
    assert optimized.BACKEND_NAME in torch._dynamo.list_backends(exclude_tags=())


def test_matches_baseline_and_applies_its_passes() -> None:
    torch.manual_seed(0)
    base_model, inputs = baseline.get_model_and_input()
    torch.manual_seed(0)
    model, _ = optimized.get_model_and_input()
    model.load_state_dict(base_model.state_dict())
    compiled = optimized.optimize(model)
    with torch.no_grad():
        expected = base_model(*inputs)
        got = compiled(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert optimized.APPLIED_PASSES.get("fuse_mul_add_to_addcmul", 0) >= 1
