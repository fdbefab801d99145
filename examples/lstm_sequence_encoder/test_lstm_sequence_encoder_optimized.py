"""Generated test of lstm_sequence_encoder_optimized.py (the template in docs/optimized-workload-contract.md)."""

from __future__ import annotations

import lstm_sequence_encoder as baseline
import lstm_sequence_encoder_optimized as optimized
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
    if not expected.is_cuda:  # on a CPU nothing is captured and nothing changes precision
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        return
    # reduced tier: cuDNN's LSTM and the head in float16 (weights stored in float16, autocast), logits as float32,
    # compared at the reduced tier's tolerance
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    assert model.lstm.weight_hh_l0.dtype == model.head.weight.dtype == torch.float16
    assert optimized.APPLIED_PASSES.get("fp16_weights", 0) >= 1
    assert optimized.APPLIED_PASSES.get("whole_forward_graph", 0) == 1  # one CUDA graph per input signature
