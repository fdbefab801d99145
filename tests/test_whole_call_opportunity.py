"""A compiled window whose GPU idles around its kernels is offered one CUDA graph for the whole call.

Replayed from real H100 profiles: `h100_mlp_activations_graph_trees.profile.json.xz` is mlp_activations' earlier
optimized workload (fp16 weights, Inductor with CUDA graph trees), reprofiled by the loop with `operator-profiler
run --compile-mode optimized` on 2026-11-24 (examples/mlp_activations/profile_optimized.json until it was redone);
the examples' current profile_optimized.json files replay a graph each workload captured itself.
`h200_classifier_graph_trees.profile.json.xz`: scripts/gpu_workloads/text_classifier_recipe.py, an
nn.TransformerEncoder classifier's reduced-tier winner as `optimize` writes it (reduce-overhead under fp16 autocast,
its graph trees' captures recorded), `scripts/record_real_workloads.py --cases classifier_graph_trees` on an H200 on
2026-11-29 (the whole call in one graph, text_classifier_optimized.py, measured 1.22x the winner by latency:
docs/measurements/h200_unseen_workloads.json). `h200_fno_winner.profile.json.xz`: the profile `operator-profiler
optimize --tier reduced` took of scripts/gpu_workloads/fno.py's winner (eager+tf32+cudnn-benchmark) on an H200 on
2026-11-29.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import FIXTURES

from mcp_server.analysis import analyze_profile
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.io import load_profile


def _analysis(path: Path, out: Path) -> Analysis:
    return analyze_profile(load_profile(path), out, profile_path=path, measure=False)


def test_graph_trees_leave_the_gpu_idle_around_the_kernels_so_the_whole_call_is_offered(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h100_mlp_activations_graph_trees.profile.json.xz").read_bytes()))
    analysis = _analysis(path, tmp_path / "out")
    whole = [o for o in analysis.opportunities if o.change_class == "whole_forward_graph"]
    assert len(whole) == 1 and whole[0].rank == 1
    opportunity = whole[0]
    # measured without the profiler: a 315.5 us window, 126.8 us of GPU work, the idle between kernels apart
    health = analysis.timeline
    assert health is not None
    inner = int(next(t for t in opportunity.triggers if t.startswith("idle_between_kernels_ns=")).split("=")[1])
    assert opportunity.estimated_saving_ns == health.idle_ns - inner > inner
    assert health.window_ns == 315_488 and "143.3 us of host work around the kernels" in opportunity.title
    assert opportunity.knowledge == "knowledge/fx_patterns/whole_forward_graph.py"
    assert "estimate (upper bound)" in opportunity.estimate_label and "compile_mode=optimized" in opportunity.triggers


def test_a_recorded_graph_tree_is_no_whole_call_graph_and_is_not_offered_reduce_overhead_again(tmp_path: Path) -> None:
    """The trees' captures are recorded like a workload's own (each replayed kernel takes its capture's ranges), but
    the harness saw the compile ask for CUDA graph trees: the call's host work around them is what is left."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_classifier_graph_trees.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    assert profile.capture_metadata.cuda_graph_trees is True and profile.capture_metadata.compile_mode == "optimized"
    assert any(w.startswith("11 window kernel(s) were replayed from CUDA graphs the workload captured")
               for w in profile.warnings)
    analysis = _analysis(path, tmp_path / "out")
    classes = [o.change_class for o in analysis.opportunities]
    assert classes[0] == "whole_forward_graph" and "cuda_graphs" not in classes
    whole = analysis.opportunities[0]
    assert "cuda_graph_trees=True" in whole.triggers and "CUDA graph trees' checks" in whole.title
    assert analysis.timeline is not None and whole.estimated_saving_ns < analysis.timeline.idle_ns


@pytest.mark.parametrize("name", ["mlp_activations", "gpt2", "embedding_projection", "conv_block"])
def test_a_window_replaying_the_workloads_own_graph_is_not_offered_it_again(name: str, tmp_path: Path) -> None:
    analysis = _analysis(REPO / "examples" / name / "profile_optimized.json", tmp_path)
    assert not [o for o in analysis.opportunities if o.change_class == "whole_forward_graph"]


def test_an_eager_window_is_offered_reduce_overhead_first(tmp_path: Path) -> None:
    analysis = _analysis(REPO / "examples" / "mlp_activations" / "profile.json", tmp_path)
    assert not [o for o in analysis.opportunities if o.change_class == "whole_forward_graph"]


def test_a_winner_whose_gpu_is_not_idle_around_its_kernels_is_offered_no_whole_call_graph(tmp_path: Path) -> None:
    """An eager recipe's winner (the Fourier operator's TF32 with cuDNN's autotuner) leaves the GPU idle between its
    kernels rather than around them: no whole-call graph, and its analysis ends (it stopped at an empty list)."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_fno_winner.profile.json.xz").read_bytes()))
    analysis = _analysis(path, tmp_path / "out")
    assert analysis.opportunities and not any(o.change_class == "whole_forward_graph" for o in analysis.opportunities)
    assert analysis.opportunities[0].title.startswith("Run 9 FP32 convolutions on tensor cores")


def test_an_eager_winner_idle_around_its_kernels_is_not_said_to_spend_it_in_dynamo(tmp_path: Path) -> None:
    """The graph-trees profile with its compiled graphs and trees taken out reads as an eager recipe's winner (an
    optimized window that compiles nothing) whose call leaves the GPU idle around its kernels: the host work is the
    eager call's, not Dynamo's guards."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h100_mlp_activations_graph_trees.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    profile.capture_metadata.cuda_graph_trees = False
    for op in profile.operators:
        op.compiled_graph = None
    path.write_text(profile.model_dump_json())
    whole = [o for o in _analysis(path, tmp_path / "out").opportunities if o.change_class == "whole_forward_graph"]
    assert len(whole) == 1 and "(the eager call's Python and dispatch, input handling)" in whole[0].title
    assert "Dynamo" not in whole[0].title
