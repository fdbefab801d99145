"""The host's own compute, replayed from an H200 recording.

`h200_cpu_offload_train.tar.xz`: scripts/gpu_workloads/cpu_offload_train.py as it is (`run --script`: a language
model whose 65,536 x 512 token embedding stays in host memory with its own Adam, the transformer on the GPU),
its nsys and timing passes, recorded by `scripts/record_real_workloads.py --cases cpu_offload_train` on an H200 on
2026-11-30. The GPU idles most of the window while the host runs the embedding's backward and its Adam step; those
operators launch no kernel, so they were invisible: the analysis read the idle time as launch overhead and ranked
torch.compile's fusion first (<= 149.6 ms of a 176.7 ms window).
"""

from __future__ import annotations

import pytest
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.host_compute import launch_idle
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.profile import OperatorAttributedProfile

SCRIPT = "cpu_offload_train.py"
LAUNCH_CHANGES = ("inductor_config", "cuda_graphs", "host_syncs", "whole_forward_graph")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    return assemble(RunDir(extract_fixture("h200_cpu_offload_train", tmp_path_factory) / "cpu_offload_train"))


@pytest.fixture(scope="module")
def analysis(profile: OperatorAttributedProfile, tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    return analyze_profile(profile, out_dir=tmp_path_factory.mktemp("analysis"), measure=False)


def _where(site: str | None) -> str | None:
    return site.rsplit("/", 1)[-1] if site else None


def test_the_host_operators_are_named_by_module_and_line(profile: OperatorAttributedProfile) -> None:
    window = profile.window
    assert window.host_compute_ns is not None and 120e6 < window.host_compute_ns < 140e6
    top = {(op.operator_name, op.module_path, _where(op.call_site)): op for op in window.host_operators or []}
    # the host Adam's step on the embedding's 33.5 M parameters (its step range names the module it updates), and
    # the embedding's backward, run by autograd on the calling thread for CPU tensors
    assert ("aten::sqrt", "Embedding", f"{SCRIPT}:58") in top and ("aten::div", "Embedding", f"{SCRIPT}:58") in top
    assert ("aten::embedding_backward", None, f"{SCRIPT}:57") in top
    listed = [op.host_time_ns for op in window.host_operators or []]
    assert listed == sorted(listed, reverse=True) and sum(listed) <= window.host_compute_ns
    assert all(op.host_time_ns >= 100_000 * op.calls for op in window.host_operators or [])  # work, not dispatch


def test_the_window_waits_on_the_host_computing_and_that_is_ranked_first(analysis: Analysis) -> None:
    health = analysis.timeline
    assert 0 < health.host_compute_ns <= health.idle_ns
    assert "its own compute" in analysis.diagnosis.root_cause and "neither do cheaper launches" in (
        analysis.diagnosis.root_cause)
    first = analysis.opportunities[0]
    assert first.change_class == "host_compute" and first.estimated_saving_ns == health.host_compute_ns
    assert f"{SCRIPT}:58" in first.title and first.knowledge == "knowledge/fx_patterns/host_compute.md"
    # what cheaper launches may recover is the idle time the host's compute leaves
    for o in analysis.opportunities:
        if o.change_class in LAUNCH_CHANGES:
            assert o.estimated_saving_ns <= launch_idle(health) + o.kernel_time_saving_ns, o.title


def test_a_window_whose_host_only_dispatches_has_no_host_compute(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Views of GPU tensors launch nothing either: Hugging Face's decode loop splits q, k and v every step, each call
    microseconds; none is the host's work, and the analysis offers nothing for it."""
    run = extract_fixture("h200_decode_loop_hf", tmp_path_factory) / "decode_loop_hf"
    decode = assemble(RunDir(run))
    assert (decode.window.host_compute_ns or 0) < 0.01 * decode.window.wall_time_ns
    analysis = analyze_profile(decode, out_dir=tmp_path_factory.mktemp("decode"), measure=False)
    assert "host_compute" not in {o.change_class for o in analysis.opportunities}
    assert "its own compute" not in analysis.diagnosis.root_cause
