"""Generated test of conv_block_optimized.py (the template in docs/optimized-workload-contract.md)."""

from __future__ import annotations

import conv_block as baseline
import conv_block_optimized as optimized
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
        got = compiled(*optimized.prepare_inputs(inputs))
    # reduced tier: the whole model in float16 (the tier's winner in recipes.json), compared at the reduced tier's
    # tolerance
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    assert optimized.APPLIED_PASSES.get("fp16_weights", 0) >= 1
    assert optimized.APPLIED_PASSES.get("channels_last", 0) >= 1
    if expected.is_cuda:
        assert optimized.APPLIED_PASSES.get("whole_forward_graph", 0) == 1  # one CUDA graph per input signature
