"""Nested (jagged) tensors among a model's inputs: torch's NVTX ranges cannot read their sizes (on an H200, the
window's own range ended after the first operator of `scripts/gpu_workloads/jagged_encoder.py`), so the nsys pass
records such a model's operators without input shapes. What finds them, on real nested tensors."""

from __future__ import annotations

import torch

from mcp_server.children.window import has_nested


def _jagged() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(5, 4)], layout=torch.jagged)


def test_a_jagged_tensor_is_found_wherever_the_arguments_hold_it():
    dense = torch.randn(3, 4)
    assert has_nested((_jagged(),))
    assert has_nested(((dense, [_jagged()]), {}))
    assert has_nested(({"tokens": _jagged(), "mask": dense},))
    assert not has_nested((dense, [dense], {"x": dense}, 3, None))
    # a strided nested tensor is nested too
    assert has_nested((torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),))
