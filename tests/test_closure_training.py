"""A physics-informed fit trained by L-BFGS on an H200, replayed: `h200_lbfgs_pinn_small.tar.xz` is
tests/scripts/lbfgs_pinn_train.py as it is (`run --script --steps 1:1`), its nsys and timing passes, recorded by
`scripts/record_real_workloads.py --cases lbfgs_pinn_small` on 2026-11-30. Its step runs the closure twice: the
forward, a second derivative by `torch.autograd.grad(create_graph=True)` twice, the loss and its backward, all on
autograd's device thread but the forward. Before: every call inside the step was the update's, and a node of the
loss's backward through the second derivative's graph was tied to a forward call that had taken the same number on
the main thread (`MmBackward0` to `aten::mse_loss`), or to none."""

from __future__ import annotations

from collections import Counter

import pytest
from fixtures_util import extract_fixture

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

MAKES = {"MmBackward0": {"aten::mm", "aten::linear"}, "TanhBackwardBackward0": {"aten::tanh_backward"},
         "TanhBackward0": {"aten::tanh"}, "AddmmBackward0": {"aten::linear"}}


@pytest.fixture(scope="module")
def pinn(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    return assemble(RunDir(extract_fixture("h200_lbfgs_pinn_small", tmp_path_factory) / "lbfgs_pinn_small"))


def test_the_closures_forward_and_backward_keep_their_phases(pinn: OperatorAttributedProfile) -> None:
    assert pinn.window.attributed_kernel_time_pct == 100.0
    calls = Counter((op.phase, op.operator_name) for op in pinn.operators if op.kernels)
    assert calls[("forward", "aten::linear")] == 2 * 2 and calls[("forward", "aten::tanh")] == 2
    assert not [op for op in pinn.operators if op.phase == "optimizer" and op.operator_name in (
        "aten::linear", "aten::tanh", "aten::mse_loss", "aten::pow", "aten::mean")]
    assert calls[("optimizer", "aten::dot")] > 0  # L-BFGS's own arithmetic


def test_every_node_is_tied_to_an_operator_that_makes_it_in_the_model(pinn: OperatorAttributedProfile) -> None:
    backward = [op for op in pinn.operators if op.phase == "backward" and op.kernels]
    tied = [(op.autograd_node, op.forward_op) for op in backward if op.autograd_node in MAKES]
    assert tied and all(forward in MAKES[node] for node, forward in tied)
    # the second and third derivatives' nodes are the model's layers'
    for op in backward:
        if op.autograd_node in ("TanhBackwardBackward0", "TanhBackward0"):
            assert op.module_path == "1", (op.autograd_node, op.forward_op)
        if op.autograd_node == "MmBackward0":
            assert op.module_path in ("0", "2"), (op.autograd_node, op.forward_op)
