"""Generated test of sdpa_attention_optimized.py (the template in docs/optimized-workload-contract.md)."""

from __future__ import annotations

import sdpa_attention as baseline
import sdpa_attention_optimized as optimized
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
    # reduced tier: FP16 projections and attention (weights stored in float16, autocast), output returned in
    # float16 as autocast gives it, compared in float32 at the reduced tier's tolerance
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    assert model.q_proj.weight.dtype == model.out_proj.weight.dtype == torch.float16
    assert optimized.APPLIED_PASSES.get("fp16_weights", 0) >= 1
    assert optimized.APPLIED_PASSES.get("qkv_fusion", 0) == 1
    if expected.is_cuda:
        assert optimized.APPLIED_PASSES.get("cuda_graphs", 0) >= 1
