"""The static KV cache: its attention equals a growing cache's, the own decode workload over it emits the baseline's
tokens, and the analysis finds a growing cache in the H200 decode loop's recorded profile and offers the pattern."""

from __future__ import annotations

import lzma

import pytest
import torch
from conftest import REPO, load_pattern, own_workload_at_small_scale
from fixtures_util import FIXTURES, extract_fixture
from torch.nn import functional as F

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.diagnosis import format_summary
from mcp_server.analysis.kv_cache import KV_NEED, growing_kv_cache
from mcp_server.backends.registry import assemble
from mcp_server.cli import main as cli
from mcp_server.rundir import RunDir
from mcp_server.schema.io import load_profile


def _pattern():
    return load_pattern("static_kv_cache")


def test_attention_over_the_static_cache_equals_the_growing_cache_s() -> None:
    torch.manual_seed(0)
    batch, heads, prompt, steps, dim = 2, 3, 5, 4, 8
    cache = _pattern().StaticKVCache(1, batch, heads, prompt + steps, dim, torch.float64, "cpu")
    q, k, v = (torch.randn(batch, heads, prompt, dim, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(cache.attend(0, q, k, v, cache.slots[:prompt]), expected)
    keys, values = k, v
    for step in range(steps):
        q, k, v = (torch.randn(batch, heads, 1, dim, dtype=torch.float64) for _ in range(3))
        keys, values = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        position = cache.slots[prompt + step:prompt + step + 1]
        assert torch.allclose(cache.attend(0, q, k, v, position), F.scaled_dot_product_attention(q, keys, values))
    assert torch.equal(cache.keys[0], keys) and torch.equal(cache.values[0], values)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_own_decode_workload_over_a_static_cache_emits_the_baseline_s_tokens(compiled: bool) -> None:
    """scripts/gpu_workloads/decode_greedy_static.py at the small scale, as a user's process would run it: the same
    tokens as decode_greedy.py, eager or compiled with its backend (Inductor on the CPU), and the same early stop when
    every sequence emits the end token."""
    check = f"""
import json, torch, decode_greedy as base, decode_greedy_static as opt
model, (prompt,) = base.get_model_and_input()
full = model(prompt)
fast = opt.StaticGreedy(model, compiled={compiled})
same = [torch.equal(fast(prompt), full), torch.equal(fast(prompt), full)]
model.eos = int(full[0, 35])  # the one sequence below emits it at its fourth new token
stopped = model(prompt[:1])
same.append(torch.equal(opt.StaticGreedy(model, compiled={compiled})(prompt[:1]), stopped))
print(json.dumps([same, list(full.shape), list(stopped.shape), opt.APPLIED_PASSES]))
"""
    same, full, stopped, passes = own_workload_at_small_scale(check)
    assert same == [True, True, True] and full == [4, 40] and stopped[1] < full[1]
    assert passes["static_kv_cache"] == 2 and passes.get("inductor", 0) == (4 if compiled else 0)


def _profile(name: str, case: str, tmp_path_factory: pytest.TempPathFactory):
    return assemble(RunDir(extract_fixture(name, tmp_path_factory) / case))


def test_the_h200_decode_loop_s_growing_cache_is_found_and_answered(tmp_path_factory) -> None:
    """The GPT-2-small decode loop recorded on the H200 (24 new tokens after a prompt of 32): its 12 attention modules'
    key lengths grow 33..55, one per step; the analysis offers the static cache where it offered CUDA graphs, and
    no other change that captures the steps in a graph without it first."""
    profile = _profile("h200_decode_loop", "decode_loop", tmp_path_factory)
    found = growing_kv_cache(profile)
    assert found is not None and len(found.module_paths) == 12 and found.module_paths[0] == "h.0"
    assert {"decode_steps=23", "key_length_min=33", "key_length_max=55"} <= set(found.triggers)
    analysis = analyze_profile(profile, out_dir=tmp_path_factory.mktemp("analysis"))
    by_class = {o.change_class: o for o in analysis.opportunities}
    static = by_class["static_kv_cache"]
    assert static.knowledge == "knowledge/fx_patterns/static_kv_cache.py" and "growing_kv_cache" in static.findings
    assert "cuda_graphs" not in by_class and static.prerequisites == []  # no synchronisation inside a step
    assert all(KV_NEED in o.prerequisites for o in analysis.opportunities
               if o.change_class in ("whole_forward_graph", "graph_breaks"))


def test_hugging_face_generate_s_growing_cache_is_answered_after_its_step_s_own_synchronisation(tmp_path_factory):
    """Hugging Face's GPT-2 `generate()` recorded on an H200 as a plain script (its nsys pass): the same growing cache
    at transformer.h.N.attn, and the static cache offered with one prerequisite, the `is_nonzero` read that runs
    inside `transformer` once a step (the stopping criteria's read between steps is not one)."""
    profile = _profile("h200_decode_loop_hf", "decode_loop_hf", tmp_path_factory)
    found = growing_kv_cache(profile)
    assert found is not None and found.module_paths[0] == "transformer.h.0.attn" and len(found.module_paths) == 12
    assert {"decode_steps=23", "key_length_min=33", "key_length_max=55"} <= set(found.triggers)
    analysis = analyze_profile(profile, out_dir=tmp_path_factory.mktemp("analysis_hf"))
    static = next(o for o in analysis.opportunities if o.change_class == "static_kv_cache")
    assert len(static.prerequisites) == 1 and "aten::is_nonzero" in static.prerequisites[0]
    inside = [p for p in analysis.syncs or [] if p.synchronizing and p.operator_name == "aten::is_nonzero"]
    assert {p.module_path for p in inside} == {None, "transformer"}


@pytest.mark.parametrize("mode", ["eager", "inductor"])
def test_a_compiled_decode_loop_s_growing_cache_is_found_too(mode: str, tmp_path) -> None:
    """The own greedy decoder profiled on the CPU (torch.profiler), eager and compiled: Inductor calls the attention as
    `aten::_scaled_dot_product_flash_attention_for_cpu` (on a GPU `..._efficient_attention`, `..._flash_attention`),
    whose key length is read the same way."""
    workload = REPO / "scripts" / "gpu_workloads" / "decode_greedy.py"
    assert cli(["profile", str(workload), "--compile-mode", mode, "-o", str(tmp_path / "run"), "-q"]) == 0
    profile = load_profile(tmp_path / "run" / "profile.json")
    found = growing_kv_cache(profile)
    assert found is not None and len(found.module_paths) == 2  # the small scale's two layers
    assert {"decode_steps=7", "key_length_min=33", "key_length_max=39"} <= set(found.triggers)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis")
    assert "growing_kv_cache" in [f.kind for f in analysis.findings]  # the CPU's analysis names the structure too
    assert "(see knowledge/fx_patterns/static_kv_cache.py)" in format_summary(analysis)


@pytest.mark.parametrize("name, case", [("h200_recipe_graphs", "recipe_graphs"), ("h100_moe_routing", "moe_routing"),
                                        ("h100_train_script", "train_script")])
def test_no_growing_cache_where_attention_keeps_its_shape(name: str, case: str, tmp_path_factory) -> None:
    assert growing_kv_cache(_profile(name, case, tmp_path_factory)) is None


def test_the_decode_loop_s_frontier_winner_still_grows_its_cache_and_is_answered(tmp_path) -> None:
    """The own greedy decoder's exact-tier winner (reduce-overhead, CUDA-graph trees: one graph per KV length),
    profiled on an H200 with `run --compile-mode optimized` (scripts/gpu_workloads/decode_greedy_recipe.py): what the
    recipe leaves includes the growing cache, found from the replays' capture-time shapes, and the static cache
    offered with no prerequisite (the end-token check runs between steps, outside the model's modules)."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_decode_greedy_winner.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    assert profile.capture_metadata.compile_mode == "optimized"
    found = growing_kv_cache(profile)
    assert found is not None and len(found.module_paths) == 12 and found.module_paths[0] == "h.0"
    assert {"decode_steps=23", "key_length_min=33", "key_length_max=55"} <= set(found.triggers)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    static = next(o for o in analysis.opportunities if o.change_class == "static_kv_cache")
    assert static.prerequisites == [] and "growing_kv_cache" in static.findings


def test_a_hand_written_attentions_growing_cache_is_found_and_its_stop_check_gates_no_model_change(tmp_path) -> None:
    """`h200_sample_decode.profile.json.xz`: scripts/gpu_workloads/sample_decode.py as it is (`--script --window-fn
    generate`), recorded by `scripts/record_real_workloads.py --cases sample_decode` on an H200 on 2026-11-29. Its
    attention is q @ k^T, softmax, @ v in one module: the probabilities @ values matmul, read as (1 query, the head
    size), hid the score matmul's growing key length. The `.item()` stop check runs between steps, outside the model:
    compiling the model, or capturing one step, needs nothing moved first; a graph of the whole window would."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_sample_decode.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    growing = growing_kv_cache(profile)
    assert growing is not None
    assert "decode_steps=48" in growing.triggers and "key_length_min=33" in growing.triggers
    assert len(growing.module_paths) == 6 and "key_length_max=80" in growing.triggers
    analysis = analyze_profile(profile, tmp_path / "out", profile_path=path, measure=False)
    syncs = [p for p in analysis.syncs or [] if p.synchronizing]
    assert syncs and all(p.call_site and p.call_site.endswith("sample_decode.py:66") and not p.module_path
                         for p in syncs)
    by_class = {o.change_class: o for o in analysis.opportunities}
    static = by_class["static_kv_cache"]
    assert not static.prerequisites and "cuda_graphs" not in by_class
    assert not by_class["inductor_config"].prerequisites
    assert by_class["sdpa_substitution"].estimated_saving_ns > 0
