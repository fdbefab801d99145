"""Workloads of kinds the checks had not met, analysed from their H200 profiles.

`h200_flex_serve.profile.json.xz`: scripts/gpu_workloads/flex_serve.py as it is (`run --script --window-fn serve`: a
packed-sequence encoder whose attention is FlexAttention with a per-batch document `BlockMask`, `flex_attention`
compiled by the script). `h200_per_sample_grads.profile.json.xz`: scripts/gpu_workloads/per_sample_grads.py's
`train_step` (DP-SGD written with `torch.func`: `vmap(grad(...))` over `functional_call`, each example's gradient
clipped, summed and noised before SGD's step). `h200_stream_ensemble.profile.json.xz`:
scripts/gpu_workloads/stream_ensemble.py as it is (`run --script --window-fn serve`: a ResNet-style CNN and a small
ViT, each on a CUDA stream of its own, launched from one thread). `h200_nbody_sim.profile.json.xz`:
scripts/gpu_workloads/nbody_sim.py as it is (`run --script --window-fn leapfrog --steps 5:5`: no module, no
optimizer; its window could not be found before a function was looked for as it begins). All recorded by
`scripts/record_real_workloads.py` on an H200 on 2026-11-30. The flex kernel spills registers, and its stage's key
issue said so twice; the ensemble's two `head`s (and a speculative decoder's draft and target blocks) shared their
module paths before the second model was named in full.
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
