"""The pattern registry is the one table of optimization patterns: its rows, the files under knowledge/fx_patterns/,
the propose skill's catalog and the analysis's opportunities all agree with it."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path
from typing import get_args

import pytest

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.pattern_registry import (
    FOLDER,
    PATTERNS,
    FindingKind,
    PatternName,
    allowed_in,
    covered_by,
    knowledge_of,
)
from mcp_server.render.views import residual_from_analysis
from mcp_server.schema.io import load_profile
from mcp_server.schema.optimizations import FP8_PASSES
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.recipes import RecipesReport

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "skills" / "propose" / "references" / "pattern-catalog.md"
ROW = re.compile(r"^\| (?P<evidence>.+?) \| `(?P<file>[a-z0-9_]+)\.py`.*? \| (?P<ir>[a-z-]+) \| (?P<passes>.+) \|$")


def test_every_pattern_file_has_its_row_and_every_row_its_files():
    files = {p.stem for p in (REPO / FOLDER).iterdir() if p.suffix in (".py", ".md") and p.stem != "__init__"}
    assert files == set(PATTERNS)
    for name, pattern in PATTERNS.items():
        assert (REPO / pattern.note).is_file(), pattern.note
        assert (REPO / FOLDER / f"{name}.py").is_file() == pattern.code, name
        assert knowledge_of(name) == pattern.knowledge and (REPO / pattern.knowledge).is_file()


def test_a_note_that_states_its_ir_level_states_the_registry_s():
    for name, pattern in PATTERNS.items():
        stated = re.search(r"IR level:\s*\*\*([a-z-]+)\*\*", (REPO / pattern.note).read_text(encoding="utf-8"))
        if stated:
            assert stated.group(1) == pattern.ir_level, name


def test_the_propose_skill_s_catalog_lists_the_registry_s_patterns_with_their_level_and_pass():
    rows = [m for line in CATALOG.read_text(encoding="utf-8").splitlines() if (m := ROW.match(line))]
    listed = {m["file"] for m in rows}
    assert listed == {name for name, p in PATTERNS.items() if p.code}  # host_syncs has no code: analyze names it
    for m in rows:
        pattern = PATTERNS[m["file"]]  # type: ignore[index]
        assert m["ir"] == pattern.ir_level, m["file"]
        assert ("precision_change" in m["passes"]) == pattern.precision_change, m["file"]
    for name, pattern in PATTERNS.items():  # a pattern may have several rows (Inductor's presets): one is its own
        assert any(f"`{pattern.pass_name}`" in m["passes"] for m in rows if m["file"] == name) or not pattern.code


def test_a_pattern_a_recipe_applies_is_covered_by_that_recipe_only():
    assert covered_by("cuda_graphs", "reduce-overhead+fp16-cast+channels-last")
    assert covered_by("channels_last", "reduce-overhead+fp16-cast+channels-last")
    assert not covered_by("cuda_graphs", "compile+bf16-autocast")
    assert not covered_by("sdpa_substitution", "reduce-overhead+fp16-cast")  # beyond every recipe
    assert covered_by("inductor_config", "reduce-overhead+fp16-cast")  # reduce-overhead compiles with Inductor
    assert {name for name, p in PATTERNS.items() if not p.recipes} == {
        "whole_forward_graph", "sdpa_substitution", "conv_bn_fold", "qkv_fusion", "graph_breaks", "host_syncs",
        "fp8_linear", "static_kv_cache", "triton_op", "graphed_training", "max_epilogue", "host_compute"}
    assert set(get_args(PatternName)) == set(PATTERNS)
    assert (PATTERNS["fp8_linear"].pass_name,) == FP8_PASSES, "the plan's fp8-tier rule names the registry's pass"


@pytest.mark.parametrize("example", ["conv_block", "gpt2"])
def test_the_analysis_s_opportunities_are_registered_patterns_answering_their_findings(example: str, tmp_path: Path):
    """The examples' recorded H100 profiles: every opportunity names a registered pattern, points to its knowledge
    and cites only findings that pattern answers."""
    path = REPO / "examples" / example / "profile.json"
    analysis = analyze_profile(load_profile(path), tmp_path, profile_path=path, measure=False)
    assert analysis.opportunities
    for opportunity in analysis.opportunities:
        pattern = PATTERNS[opportunity.change_class]  # type: ignore[index]
        assert opportunity.knowledge == pattern.knowledge
        assert set(opportunity.findings) <= set(pattern.answers) <= set(get_args(FindingKind))


def test_what_is_left_after_a_recipe_leaves_out_the_patterns_that_recipe_applies(tmp_path: Path):
    """gpt2's eager H100 analysis offers Inductor's fusion, CUDA graphs, SDPA and tensor-core GEMMs; after the winner
    reduce-overhead+fp16-cast only the SDPA substitution, which no recipe makes, is left."""
    path = REPO / "examples" / "gpt2" / "profile.json"
    analysis = analyze_profile(load_profile(path), tmp_path, profile_path=path, measure=False)
    everything = {r.pattern for r in residual_from_analysis(analysis, [])}
    after = {r.pattern for r in residual_from_analysis(analysis, [], recipe="reduce-overhead+fp16-cast")}
    assert everything == {knowledge_of(n) for n in ("inductor_config", "cuda_graphs", "sdpa_substitution",
                                                     "dtype_autocast")}
    assert after == {knowledge_of("sdpa_substitution")}


def test_half_precision_gemms_that_dominate_point_to_fp8_linear(tmp_path: Path):
    """mlp_activations' eager H100 profile (its GEMMs hold most of the kernel time), its GEMM kernels' counters read
    as the same FLOPs on BF16 tensor cores (no half-precision recording is committed): the analysis finds the BF16
    GEMMs and offers FP8 GEMMs, in the fp8 tier, pointing to fp8_linear.py; the profile as recorded (FP32 GEMMs)
    offers no such thing."""
    path = REPO / "tests" / "fixtures" / "h100_timing_profiles" / "mlp_activations_eager.json.xz"
    with lzma.open(path) as src:
        data = json.loads(src.read())
    as_recorded = OperatorAttributedProfile.model_validate(data)
    before = analyze_profile(as_recorded, tmp_path / "fp32", measure=False)
    assert "half_matmul" not in {f.kind for f in before.findings}
    for op in data["operators"]:
        if op["operator_name"] == "aten::linear":
            for kernel in op["kernels"]:
                m = kernel["metrics"]
                fp32 = 2 * m["inst_ffma"]["value"] + m["inst_fadd"]["value"] + m["inst_fmul"]["value"]
                m["flop_tensor_bf16"] = {**m["flop_tensor_bf16"], "value": fp32}
                for key in ("inst_ffma", "inst_fadd", "inst_fmul"):
                    m[key] = {**m[key], "value": 0.0}
    after = analyze_profile(OperatorAttributedProfile.model_validate(data), tmp_path / "bf16", measure=False)
    finding = next(f for f in after.findings if f.kind == "half_matmul")
    assert "BF16/FP16 GEMM" in finding.title and finding.kernel_ids
    offered = next(o for o in after.opportunities if o.change_class == "fp8_linear")
    assert offered.knowledge == knowledge_of("fp8_linear") == "knowledge/fx_patterns/fp8_linear.py"
    assert "fp8 precision tier" in offered.title and offered.estimate_label.startswith("estimate (upper bound)")
    assert offered.findings == ["half_matmul"]


def test_what_is_left_in_the_exact_tier_puts_the_reduced_precision_changes_last_and_says_why(tmp_path: Path):
    """The own MoE's exact-tier winner profiled on an H200 (reduce-overhead, fp32): its analysis ranks "FP32 GEMMs on
    tensor cores" (a reduced-tier change) first; an exact-tier report lists the split routers' Triton op first and
    that one last, outside its tier."""
    path = tmp_path / "profile.json"
    fixture = REPO / "tests" / "fixtures" / "h200_moe_topk_winner.profile.json.xz"
    path.write_bytes(lzma.decompress(fixture.read_bytes()))
    analysis = analyze_profile(load_profile(path), tmp_path / "analysis", profile_path=path, measure=False)
    assert analysis.opportunities[0].change_class == "dtype_autocast"
    rows = residual_from_analysis(analysis, [], recipe="reduce-overhead+fp32", tier="exact")
    assert [r.pattern for r in rows] == [knowledge_of("triton_op"), knowledge_of("dtype_autocast")]
    assert rows[-1].title.endswith("— outside this report's exact tier (needs reduced)")
    assert rows[0].title.startswith("#2 ") and "(analysis #1)" in rows[-1].title and not rows[-1].title.startswith("#")
    assert "outside" not in residual_from_analysis(analysis, [], recipe="reduce-overhead+fp32", tier="reduced")[0].title
    assert allowed_in("fp8_linear", "fp8") and not allowed_in("fp8_linear", "reduced")
    assert allowed_in("triton_op", "exact") and not allowed_in("fp16_weights", "exact")


def test_what_is_left_says_when_the_frontier_measured_a_pattern_on_its_winner_and_puts_it_last(tmp_path: Path):
    """A ConvNeXt-style model (scripts/gpu_workloads/convnext_small.py) through `optimize --tier reduced` on an H200:
    its winner reduce-overhead+fp16-cast leaves two layout conversions, so the analysis of the winner's profile offers
    channels_last; the frontier had run channels-last on that winner and measured it slower. The report's "what is
    left" says so with both times and lists it after the changes nothing measured."""
    path = tmp_path / "profile.json"
    fixtures = REPO / "tests" / "fixtures"
    path.write_bytes(lzma.decompress((fixtures / "h200_convnext_winner.profile.json.xz").read_bytes()))
    frontier = RecipesReport.model_validate_json(
        lzma.decompress((fixtures / "h200_convnext_recipes.json.xz").read_bytes()))
    analysis = analyze_profile(load_profile(path), tmp_path / "analysis", profile_path=path, measure=False)
    assert "channels_last" in {o.change_class for o in analysis.opportunities}
    plain = residual_from_analysis(analysis, [], recipe="reduce-overhead+fp16-cast", tier="reduced")
    rows = residual_from_analysis(analysis, [], recipe="reduce-overhead+fp16-cast", tier="reduced", frontier=frontier)
    assert {r.pattern for r in rows} == {r.pattern for r in plain}
    last = rows[-1]
    assert last.pattern == knowledge_of("channels_last")
    winner = next(r for r in frontier.results if r.recipe == "reduce-overhead+fp16-cast").time_ns("latency")
    tried = next(r for r in frontier.results if r.recipe == "reduce-overhead+fp16-cast+channels-last")
    assert tried.time_ns("latency") > winner
    assert last.title.endswith(f"the frontier measured it on its winner: reduce-overhead+fp16-cast+channels-last, "
                               f"{tried.time_ns('latency') / 1e3:.1f} µs against {winner / 1e3:.1f} µs by latency "
                               "(slower; recipes.json)")
    assert not any("frontier measured" in r.title for r in rows[:-1])


def test_a_launch_bound_rnn_training_step_is_offered_graphed_forward_and_backward_not_the_inference_graph(
        tmp_path: Path):
    """scripts/gpu_workloads/gru_lm_train.py (`run --script`, H200): a GRU language model's training step, 30 % GPU
    busy, its cuDNN GRU forward and backward launch-bound. The whole-forward graph clones outputs with no autograd
    history (no gradient would reach the parameters); the offer is make_graphed_callables, its saving counting the
    gaps of the model's forward and backward only (not the loss's, not the optimizer's)."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((REPO / "tests" / "fixtures" / "h200_gru_lm_train.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    assert profile.capture_metadata.run_mode == "train_step"
    analysis = analyze_profile(profile, tmp_path / "analysis", profile_path=path, measure=False)
    classes = [o.change_class for o in analysis.opportunities]
    assert "whole_forward_graph" not in classes and classes[0] == "graphed_training"
    offered = analysis.opportunities[0]
    assert offered.knowledge == knowledge_of("graphed_training") == "knowledge/fx_patterns/graphed_training.py"
    assert "make_graphed_callables" in offered.title
    window = profile.window.unprofiled_wall_time_ns
    assert window and 0 < offered.estimated_saving_ns < window - profile.window.unprofiled_gpu_busy_time_ns


def test_what_is_left_says_when_the_frontier_measured_the_winners_compile_mode_swapped(tmp_path: Path):
    """A DLRM-style recommender (scripts/gpu_workloads/dlrm.py) through `optimize --tier reduced` on an H200
    (2026-11-29; the fixtures are its recipes.json and the winner's profile_optimized.json): the winner
    compile+fp16-cast leaves a host-bound window, so the analysis offers reduce-overhead; the frontier had run
    reduce-overhead+fp16-cast, reduce-overhead in place of the winner's compile, and measured it slower."""
    fixtures = REPO / "tests" / "fixtures"
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((fixtures / "h200_dlrm_winner.profile.json.xz").read_bytes()))
    frontier = RecipesReport.model_validate_json(lzma.decompress((fixtures / "h200_dlrm_recipes.json.xz").read_bytes()))
    analysis = analyze_profile(load_profile(path), tmp_path / "analysis", profile_path=path, measure=False)
    assert [o.change_class for o in analysis.opportunities] == ["cuda_graphs"]
    rows = residual_from_analysis(analysis, [], recipe="compile+fp16-cast", tier="reduced", frontier=frontier)
    assert len(rows) == 1 and rows[0].pattern == knowledge_of("cuda_graphs")
    assert rows[0].title.endswith("the frontier measured it on its winner: reduce-overhead+fp16-cast, 701.4 µs against "
                                  "588.9 µs by latency (slower; recipes.json)")


def test_what_is_left_says_when_every_whole_model_recipe_of_the_pattern_failed_on_the_frontier(tmp_path: Path):
    """The Fourier operator (scripts/gpu_workloads/fno.py) through `optimize --tier reduced` on an H200 (2026-11-29;
    the fixtures are its recipes.json and the winner's profile): the winner eager+tf32+cudnn-benchmark leaves nine
    FP32 convolutions, for which the analysis offers bfloat16 autocast; the frontier had run every bfloat16 and
    float16 recipe on the whole model and each failed (no bfloat16 FFT, no complex-half einsum). What is left keeps the
    offer, says so with the first failure, and names the scoped change as the way left."""
    fixtures = REPO / "tests" / "fixtures"
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((fixtures / "h200_fno_winner.profile.json.xz").read_bytes()))
    frontier = RecipesReport.model_validate_json(lzma.decompress((fixtures / "h200_fno_recipes.json.xz").read_bytes()))
    half = [r for r in frontier.results if {"bf16-autocast", "fp16-autocast", "bf16-cast", "fp16-cast"}
            & set(r.recipe.split("+"))]
    assert len(half) == 12 and all(r.status == "failed" for r in half)
    analysis = analyze_profile(load_profile(path), tmp_path / "analysis", profile_path=path, measure=False)
    assert [o.change_class for o in analysis.opportunities] == ["dtype_autocast"]
    rows = residual_from_analysis(analysis, [], recipe="eager+tf32+cudnn-benchmark", tier="reduced", frontier=frontier)
    assert len(rows) == 1 and rows[0].pattern == knowledge_of("dtype_autocast")
    said = rows[0].title
    assert "the frontier applied it to the whole model in 12 recipe(s) and none ran within a tier" in said
    assert f"({half[0].recipe}: " in said and "only a change scoped to the kernels named here can apply it" in said
    plain = residual_from_analysis(analysis, [], recipe="eager+tf32+cudnn-benchmark", tier="reduced")
    assert "frontier" not in plain[0].title  # without recipes.json nothing is said
