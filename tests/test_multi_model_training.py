"""Training loops with two models and an optimizer each, replayed from H200 recordings.

`h200_wgan_gp_train.tar.xz`: scripts/gpu_workloads/gan_train.py as it is, as a WGAN-GP (`run --script --steps 4:1
-- --wgan-gp --critic-steps 2`: two critic steps per generator step, each critic loss with a gradient penalty taken
by `torch.autograd.grad(create_graph=True)`), its nsys and timing passes. `h200_gan_train.profile.json.xz`: the same
script as a DCGAN (`run --script`), its profile. Both recorded by `scripts/record_real_workloads.py` on an H200 on
2026-11-30. Before: a step was one step of the first optimizer to step (the discriminator's), so a window cut the
loop's iteration in two and the generator's forward fell outside it; every update's work was the first model's
(`Generator`); and the nodes of the penalty's second backward had neither forward operator nor module.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fixtures_util import extract_fixture, recorded_profile

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

CRITIC_NORMS = ("body.0.1", "body.1.1", "body.2.1")


@pytest.fixture(scope="module")
def wgan(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    return assemble(RunDir(extract_fixture("h200_wgan_gp_train", tmp_path_factory) / "wgan_gp_train"))


def _updates(profile: OperatorAttributedProfile) -> Counter[str | None]:
    return Counter(op.module_path for op in profile.operators if op.phase == "optimizer" and op.kernels)


def test_a_step_is_the_loops_iteration_ended_by_its_last_optimizer(wgan: OperatorAttributedProfile) -> None:
    assert wgan.window.attributed_kernel_time_pct == 100.0
    # one iteration: two critic steps and one generator step, each Adam's update under the model it updates
    assert _updates(wgan) == {"Discriminator": 14, "Generator": 7}
    # the generator's forward ran inside the window, so its backward nodes find their modules
    generator = {op.module_path for op in wgan.operators if op.phase == "backward"
                 and op.operator_name == "aten::convolution_backward"}
    assert {"seed.0", "grow.0.0", "rgb"} <= generator


def test_the_penaltys_second_backward_differentiates_the_first_backwards_operators(
        wgan: OperatorAttributedProfile) -> None:
    second = [op for op in wgan.operators if (op.autograd_node or "").endswith("BackwardBackward0")]
    # run on autograd's thread for CUDA, as the first backward's operators that made its nodes were
    assert {(op.autograd_node, op.forward_op) for op in second} == {
        ("CudnnBatchNormBackwardBackward0", "aten::cudnn_batch_norm_backward"),
        ("ConvolutionBackwardBackward0", "aten::convolution_backward"),
        ("LeakyReluBackwardBackward0", "aten::leaky_relu_backward")}
    assert all(op.module_path for op in second) and all(op.phase == "backward" for op in second)
    # cuDNN BatchNorm's backward, differentiated again, runs as 80 operators per norm of the critic in each step
    assert Counter(op.module_path for op in second if op.autograd_node == "CudnnBatchNormBackwardBackward0") == {
        norm: 160 for norm in CRITIC_NORMS}


def test_a_dcgans_updates_are_each_its_models(tmp_path: Path) -> None:
    profile = recorded_profile("h200_gan_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.capture_metadata.root_module == "Generator"  # the model called first
    assert _updates(profile) == {"Discriminator": 7, "Generator": 7}
    assert not [op for op in profile.operators if op.operator_name == "aten::ones_like" and op.phase == "forward"]
