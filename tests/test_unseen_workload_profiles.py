"""Workloads of kinds the checks had not met, analysed from their H200 profiles.

`h200_flex_serve.profile.json.xz`: scripts/gpu_workloads/flex_serve.py as it is (`run --script --window-fn serve`: a
packed-sequence encoder whose attention is FlexAttention with a per-batch document `BlockMask`, `flex_attention`
compiled by the script). `h200_per_sample_grads.profile.json.xz`: scripts/gpu_workloads/per_sample_grads.py's
`train_step` (DP-SGD written with `torch.func`: `vmap(grad(...))` over `functional_call`, each example's gradient
clipped, summed and noised before SGD's step). `h200_stream_ensemble.profile.json.xz`:
scripts/gpu_workloads/stream_ensemble.py as it is (`run --script --window-fn serve`: a ResNet-style CNN and a small
ViT, each on a CUDA stream of its own, launched from one thread). `h200_nbody_sim.profile.json.xz`:
scripts/gpu_workloads/nbody_sim.py as it is (`run --script --window-fn leapfrog --steps 5:5`: no module, no
optimizer; its window could not be found before a function was looked for as it begins).
`h200_ppo_collect.profile.json.xz`: scripts/gpu_workloads/ppo_train.py's rollouts (`--window-fn collect --steps 2:1
-- --iterations 10 --epochs 1`: a policy under `no_grad` whose actions go to NumPy environments every step).
`h200_torchscript_serve.profile.json.xz`: scripts/gpu_workloads/torchscript_serve.py (`--window-fn serve`: a model
compiled by `torch.jit.script`). `h200_recsys_sparse_train.profile.json.xz`: scripts/gpu_workloads/
recsys_sparse_train.py (`EmbeddingBag` tables with sparse gradients updated by `SparseAdam`, the MLPs by `Adam`).
All recorded by `scripts/record_real_workloads.py` on an H200 on 2026-11-30. The flex kernel spills registers, and
its stage's key issue said so twice; the ensemble's two `head`s (and a speculative decoder's draft and target
blocks) shared their module paths before the second model was named in full.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fixtures_util import recorded_profile

from mcp_server.analysis import analyze_profile


def test_flex_attention_is_each_blocks_generated_kernel_and_its_issue_is_said_once(tmp_path: Path) -> None:
    profile = recorded_profile("h200_flex_serve", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    flex = [op for op in profile.operators if "flex_attention" in op.operator_name]
    assert [op.module_path for op in flex] == [f"blocks.{b}" for b in range(4)]
    assert all(op.is_fused and op.compiled_graph for op in flex)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    assert analysis.configuration.compile_mode == "eager (the workload's own torch.compile: 1 compiled graph(s) ran)"
    issues = {op.key_issue for op in analysis.operators if op.operator_id in {f.operator_id for f in flex}}
    assert issues and all(issue.startswith("register spills: ") and issue.count("register spills") == 1
                          for issue in issues)
    # the block mask is built outside the model, at the script's line, and its work is named there
    mask = [op for op in profile.operators if op.module_path is None]
    assert mask and {op.call_site.rsplit("/", 1)[-1] for op in mask if op.call_site} <= {
        "flex_serve.py:64", "flex_serve.py:66"}


def test_per_example_gradients_are_the_backward_and_their_clipping_and_noise_the_update(tmp_path: Path) -> None:
    profile = recorded_profile("h200_per_sample_grads", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    by_phase = profile.window.kernel_time_by_phase_ns or {}
    assert by_phase["backward"] > 5 * by_phase["forward"]  # per-example weight gradients: grouped convolutions
    seed = [op for op in profile.operators if op.operator_name == "aten::ones_like"]
    assert [op.phase for op in seed] == ["backward"]  # grad()'s seed, made at the vmap(grad(...)) line
    update = [op for op in profile.operators if op.phase == "optimizer" and op.module_path is None]
    lines = {op.call_site.rsplit(":", 1)[-1] for op in update if op.call_site}
    assert {"53", "54", "57", "58"} <= lines  # norms, scale, clipped sum, noise
    convolutions = [op for op in profile.operators if op.operator_name == "aten::convolution_backward"]
    assert convolutions and all(op.module_path and op.module_path.startswith("features.") for op in convolutions)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    assert analysis.diagnosis.bottleneck.value == "launch_overhead"


def test_an_ensembles_second_model_keeps_module_paths_of_its_own(tmp_path: Path) -> None:
    profile = recorded_profile("h200_stream_ensemble", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.capture_metadata.root_module == "ConvNet"  # the model called first
    heads = {op.module_path for op in profile.operators if op.operator_name in ("aten::linear", "aten::addmm")
             and op.module_path and op.module_path.endswith("head")}
    assert heads == {"head", "ViT.head"}
    cnn = {k.stream_id for op in profile.operators if op.module_path and op.module_path.startswith(("stem", "stages"))
           for k in op.kernels}
    vit = {k.stream_id for op in profile.operators if op.module_path and op.module_path.startswith("ViT.")
           for k in op.kernels}
    assert len(cnn) == len(vit) == 1 and cnn != vit  # each model's kernels on its own stream
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    stages = {row.label for row in analysis.stages}
    assert any(name.startswith("ViT.encoder.layers.") for name in stages), sorted(stages)[:10]


def test_a_simulation_without_modules_is_named_by_its_lines(tmp_path: Path) -> None:
    profile = recorded_profile("h200_nbody_sim", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0 and profile.window.call_site_kernel_time_pct == 100.0
    assert profile.window.module_path_kernel_time_pct == 0.0 and {op.phase for op in profile.operators} == {"forward"}
    # five leapfrog steps, two force evaluations each: one cdist per evaluation, at its line
    cdist = Counter(op.call_site.rsplit("/", 1)[-1] for op in profile.operators if op.operator_name == "aten::cdist")
    assert cdist == {"nbody_sim.py:24": 10}
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    assert analysis.diagnosis.bottleneck.value == "memory"
    assert analysis.stages[0].label == "aten::cdist"


def test_the_waits_of_a_rollout_are_named_at_their_lines_and_gate_the_graph_advice(tmp_path: Path) -> None:
    profile = recorded_profile("h200_ppo_collect", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    waits = {(p.operator_name, p.call_site.rsplit("/", 1)[-1]): p for p in analysis.syncs or []
             if p.synchronizing and p.call_site and (p.idle_after_ns or 0) > 0}
    # the actions copied to the host, and torch.distributions' argument checks (a bool() of a tensor, in torch's
    # code, named at the script's lines that built the distribution and asked its log-probability)
    assert set(waits) == {("aten::to", "ppo_train.py:66"), ("aten::is_nonzero", "ppo_train.py:60"),
                          ("aten::is_nonzero", "ppo_train.py:64")}
    assert all(p.count == 64 for p in waits.values())  # once per step of the rollout
    graphs = next(o for o in analysis.opportunities if o.change_class == "cuda_graphs")
    assert any(need.startswith("move the bool() read(s) at ppo_train.py:60, ppo_train.py:64 out of the loop")
               for need in graphs.prerequisites)


def test_a_torchscript_model_is_named_by_its_class_and_the_line_calling_it(tmp_path: Path) -> None:
    profile = recorded_profile("h200_torchscript_serve", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0 and profile.capture_metadata.root_module == "Classifier"
    inside = [op for op in profile.operators if op.module_path == "Classifier"]
    assert {op.operator_name for op in inside} >= {"aten::conv2d", "aten::batch_norm", "aten::linear"}
    assert {op.call_site.rsplit("/", 1)[-1] for op in profile.operators if op.call_site} == {
        "torchscript_serve.py:57"}
    assert any(w.startswith("Classifier is TorchScript") for w in profile.warnings)


def test_a_sparse_optimizers_update_is_the_embedding_tables(tmp_path: Path) -> None:
    profile = recorded_profile("h200_recsys_sparse_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    updates = Counter((op.module_path, op.operator_name) for op in profile.operators
                      if op.phase == "optimizer" and op.kernels)
    assert updates[("tables", "aten::coalesce")] == 8  # SparseAdam: each table's sparse gradient coalesced
    assert {module for module, _ in updates} == {"tables", "Recommender"}  # Adam's: the bottom and top MLPs


def test_a_host_resident_embeddings_copies_are_named_at_its_line(tmp_path: Path) -> None:
    """scripts/gpu_workloads/cpu_offload_train.py (`h200_cpu_offload_train.profile.json.xz`): the embedded batch goes to
    the GPU from pageable memory, and autograd copies its gradient back to pageable memory, waiting, in the
    backward: both at the line that made the copy."""
    profile = recorded_profile("h200_cpu_offload_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    host = [e for e in profile.runtime_events or [] if e.kind == "memcpy" and e.copy_kind in ("HtoD", "DtoH")]
    line = "cpu_offload_train.py:52"
    assert {(e.copy_kind, e.src_memory, e.dst_memory, e.bytes, e.synchronizing) for e in host
            if e.call_site and e.call_site.endswith(line)} == {
        ("HtoD", "pageable", "device", 8 << 20, False), ("DtoH", "device", "pageable", 8 << 20, True)}
    assert all(e.call_site for e in host)
    assert {op.module_path for op in profile.operators if op.phase == "optimizer" and op.kernels} == {"Body"}
