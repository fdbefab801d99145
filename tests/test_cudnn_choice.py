"""Convolution kernels cuDNN chose by heuristic that leave the GPU almost empty, read from recorded H200 profiles of
the VAE training script (`scripts/record_real_workloads.py --cases vae_train`, and `run --script vae_train.py --
--cudnn-benchmark`): the heuristic run's four 2-block weight-gradient kernels are found and the analysis offers
cuDNN's autotuner; with the autotuner on, and in other convolutional workloads, nothing is found."""

from __future__ import annotations

import pytest
from fixtures_util import extract_fixture, recorded_profile

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.cudnn_choice import heuristic_convolutions
from mcp_server.analysis.timeline_health import place_kernels, window_length
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir


def _found(profile):
    return heuristic_convolutions(profile, place_kernels(profile, window_length(profile)[0]))


def test_the_vae_s_two_block_weight_gradients_are_found_and_the_autotuner_offered(tmp_path) -> None:
    profile = recorded_profile("h200_vae_train", tmp_path)
    found = _found(profile)
    assert found is not None and found.module_paths == ["decoder.9", "encoder.0"]
    assert "underfilled_conv_kernels=4" in found.triggers and "2 block(s) on 132 SMs" in found.title
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis")
    offer = next(o for o in analysis.opportunities if o.change_class == "cudnn_benchmark")
    assert offer.findings == ["heuristic_conv"] and "torch.backends.cudnn.benchmark = True" in offer.title
    # the autotuner's measured gain in kernel time (15.2 -> 5.8 ms a step) stays under the estimate's bound
    assert 9_000_000 <= offer.estimated_saving_ns <= profile.window.kernel_time_ns
    assert offer.knowledge == "knowledge/fx_patterns/cudnn_benchmark.md"


def test_nothing_is_found_once_the_autotuner_was_on(tmp_path) -> None:
    """The same script with --cudnn-benchmark: cuDNN's timed picks fill the GPU; and the heuristic profile, marked as
    one the autotuner ran in, offers nothing either (the kernels it kept were timed)."""
    assert _found(recorded_profile("h200_vae_train_cudnn_benchmark", tmp_path)) is None
    profile = recorded_profile("h200_vae_train", tmp_path)
    marked = profile.model_copy(update={"capture_metadata": profile.capture_metadata.model_copy(
        update={"cudnn_benchmark": True})})
    assert _found(marked) is None


@pytest.mark.parametrize("name, case", [("h200_conv_block_eager", "conv_block_eager"),
                                        ("h100_train_script", "train_script")])
def test_no_heuristic_convolution_elsewhere(name: str, case: str, tmp_path_factory) -> None:
    profile = assemble(RunDir(extract_fixture(name, tmp_path_factory) / case))
    assert _found(profile) is None
