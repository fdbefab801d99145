"""Real workloads, replayed from their H100 recordings (`scripts/record_real_workloads.py`:
tests/fixtures/h100_<case>.tar.xz): a decode loop profiled as a plain script under the replay budget, a plain
training script, an MoE layer's synchronisations, and a workload that captures its own CUDA graph; and the decode loop
recorded again on an H200 (tests/fixtures/h200_decode_loop.tar.xz) once its variant replay kept to the window; a
training loop without torch.optim on an H200 (h200_manual_train.tar.xz); an HF generate() loop on an H200
(h200_decode_loop_hf.tar.xz), whose shape-variant pass pays its warm-up from the budget."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import FIXTURES, extract_fixture

from mcp_server.analysis import analyze_profile
from mcp_server.assemble.attribute import CAPTURED_DETAIL
from mcp_server.backends.registry import assemble
from mcp_server.capture.budget import variant_share, within_budget
from mcp_server.capture.replay_plan import plan_replays
from mcp_server.capture.request import CaptureRequest
from mcp_server.capture.variants import MIN_VARIANT_SHARE, ncu_variants_pass
from mcp_server.compare import compare_profiles
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.requests import NcuOptions


def _recorded(case: str, tmp_path_factory: pytest.TempPathFactory, gpu: str = "h100") -> Path:
    assert (FIXTURES / f"{gpu}_{case}.tar.xz").is_file(), "recorded by scripts/record_real_workloads.py on the GPU"
    return extract_fixture(f"{gpu}_{case}", tmp_path_factory) / case


def _kernels(profile: OperatorAttributedProfile) -> list:
    return [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels


def test_a_decode_loop_plans_its_replay_within_the_budget(tmp_path_factory):
    run = _recorded("decode_loop", tmp_path_factory)
    profile = assemble(RunDir(run))
    harness = json.loads((run / "nsys" / "harness.json").read_text())
    assert harness["steps"]["kind"] == "function" and harness["steps"]["seen"] == 2
    window = profile.window
    assert window.no_counter_kernel_time_pct is not None and window.no_counter_kernel_time_pct <= 5.0
    by_id = {k.kernel_id: k for k in _kernels(profile)}
    nearest = [k for k in by_id.values() if k.propagation == "nearest_shape"]
    for kernel in nearest:  # a left-out variant takes a replayed launch of its own configuration
        source = by_id[kernel.propagated_from]
        assert (source.mangled_name, source.grid, source.block) == (kernel.mangled_name, kernel.grid, kernel.block)
        assert source.propagated_from is None
    manifest = json.loads((run / "manifest.json").read_text())
    ncu = next(p for p in manifest["passes"] if p["name"] == "ncu")
    assert ncu["ncu"]["replay_budget_s"] == 60.0


def test_a_scripts_variant_pass_replays_its_module_calls_in_the_window_only(tmp_path_factory):
    """Recorded on an H200 once the script's module calls counted from the window's start: the variant pass replayed
    the launches its plan named, once, and every record joins a window launch. (The H100 recording, made before,
    replayed them in the warm-up step too: 143 of its records match no window launch.)"""
    run = extract_fixture("h200_decode_loop", tmp_path_factory) / "decode_loop"
    profile = assemble(RunDir(run))
    manifest = json.loads((run / "manifest.json").read_text())
    variants = next(p for p in manifest["passes"] if p["name"] == "ncu_variants")
    attached = (run / "ncu_variants" / "attach.log").read_text()
    assert attached.count("==PROF== Profiling") == len(variants["replayed_launches"]) == 122
    assert not [w for w in profile.warnings if "mismatch" in w], profile.warnings
    assert profile.window.no_counter_kernel_time_pct == 0.0
    old = assemble(RunDir(_recorded("decode_loop", tmp_path_factory)))
    assert any("143 ncu records match no later window launch" in w for w in old.warnings)


def test_a_plain_training_script_is_attributed_like_the_contract(tmp_path_factory):
    run = _recorded("train_script", tmp_path_factory)
    profile = assemble(RunDir(run))
    window = profile.window
    assert window.attributed_kernel_time_pct is not None and window.attributed_kernel_time_pct >= 99.5
    assert window.module_path_kernel_time_pct is not None and window.module_path_kernel_time_pct >= 95.0
    assert set(window.kernel_time_by_phase_ns or {}) == {"forward", "backward", "optimizer"}
    script = REPO / "scripts" / "gpu_workloads" / "train_script.py"
    line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "loss = loss_fn(" in text)
    assert any(op.call_site and op.call_site.endswith(f"train_script.py:{line}") for op in profile.operators)
    assert profile.capture_metadata.root_module == "ResNet"
    # autograd's engine launches the backward from a thread of its own, inside operator ranges: nothing to warn of
    assert not [w for w in profile.warnings if "thread other than" in w], profile.warnings


def test_a_training_loop_without_torch_optim_takes_its_steps_from_backward(tmp_path_factory):
    """tests/scripts/manual_train.py (its update by hand under torch.no_grad, no optimizer) recorded on an H200 with
    `--window-fn backward`: each step ends at backward(), the update's kernels are the optimizer phase, and every
    kernel is attributed with its call site. The fixture holds the nsys pass (the recording script leaves this case's
    ncu passes out for size: 84 MB of reports for 23 kernels)."""
    run = _recorded("manual_train", tmp_path_factory, gpu="h200")
    harness = json.loads((run / "nsys" / "harness.json").read_text())
    assert harness["steps"]["kind"] == "backward" and harness["steps"]["seen"] >= 4
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert set(profile.window.kernel_time_by_phase_ns or {}) == {"forward", "backward", "optimizer"}
    update = [op for op in profile.operators if op.phase == "optimizer"]
    assert {op.operator_name for op in update} == {"aten::mul", "aten::sub_"} and len(update) == 8  # 4 parameters
    assert all(op.call_site and op.call_site.endswith("manual_train.py:22") for op in update)
    assert all(op.call_site for op in profile.operators)


def test_a_training_steps_backward_convolutions_are_work_not_fusible_element_wise_kernels(tmp_path_factory):
    """ResNet-50's weight and data gradients (aten::convolution_backward: cuDNN's wgrad and dgrad implicit GEMMs) hold
    a third of the step's kernel time; counted as element-wise work, the fusion opportunity's upper bound claimed
    nearly all of the GPU's time (14.3 of 16.9 ms on the H200 recording)."""
    from mcp_server.analysis.detect import fusible_kernels, work_kernels
    from mcp_server.analysis.timeline_health import place_kernels

    profile = assemble(RunDir(_recorded("train_script", tmp_path_factory)))
    placed = place_kernels(profile, profile.window.wall_time_ns or 0)
    fusible, work = fusible_kernels(placed), work_kernels(placed)
    gradients = [p.kernel for p in placed if p.op is not None and p.op.operator_name == "aten::convolution_backward"]
    assert gradients and all(k.kernel_id in work and k.kernel_id not in fusible for k in gradients)
    total = sum(p.kernel.duration_ns for p in placed)
    assert sum(k.duration_ns for k in gradients) > 0.25 * total
    assert sum(p.kernel.duration_ns for p in placed if p.kernel.kernel_id in fusible) < 0.6 * total


def test_every_nonzero_synchronisation_of_the_moe_layer_is_named_and_costed(tmp_path_factory, tmp_path):
    run = _recorded("moe_routing", tmp_path_factory)
    profile = assemble(RunDir(run))
    conn = sqlite3.connect(run / "nsys" / "report.sqlite")
    (start, end), = conn.execute(
        "SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59 "
        "AND COALESCE(n.text, s.value) = 'operator_profiler::measure'").fetchall()
    raw_syncs = conn.execute(
        "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE "
        "'cudaStreamSynchronize%' AND r.start BETWEEN ? AND ?", (start, end)).fetchone()[0]
    source = (REPO / "scripts" / "gpu_workloads" / "moe_routing.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if ".nonzero()" in text)
    syncs = [e for e in profile.runtime_events or [] if e.synchronizing and e.origin == "workload"]
    assert len(syncs) == raw_syncs >= 8, "one per expert at least"
    nonzero = [e for e in syncs if "aten::nonzero" in (e.operator_name, e.launch_op)]
    assert nonzero and all(e.call_site and e.call_site.endswith(f"moe_routing.py:{line}") for e in nonzero)
    assert all(e.unprofiled_idle_after_ns is not None for e in nonzero)
    analysis = analyze_profile(profile, tmp_path, measure=False)
    for opportunity in analysis.opportunities:
        if opportunity.change_class in ("cuda_graphs", "inductor_config"):
            assert any("capture_dynamic_output_shape_ops" in need for need in opportunity.prerequisites)
            assert re.search(r"— first make the shapes static \(aten::nonzero", opportunity.title)


def test_a_workloads_own_cuda_graph_is_attributed_to_its_capture(tmp_path_factory):
    run = _recorded("lstm_graphs", tmp_path_factory, "h200")
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct is not None and profile.window.attributed_kernel_time_pct >= 99.5
    replayed = [op for op in profile.operators if any(k.attribution.detail == CAPTURED_DETAIL for k in op.kernels)]
    assert any(op.operator_name == "aten::lstm" for op in replayed), "the cuDNN LSTM the graph replays"
    # captured outside eager mode (the workload compiles its embedding and head), with the model's modules hooked
    window = profile.window
    assert window.module_path_kernel_time_pct is not None and window.module_path_kernel_time_pct >= 99.5
    assert {op.module_path for op in replayed if op.operator_name == "aten::lstm"} == {"lstm"}
    # the graph's streams interleave otherwise in the timing pass (277 of 537 launches in another order): each launch
    # takes the gap before the same launch of its kernel there
    assert not any("launches of the timing pass are other kernels" in w for w in profile.warnings)
    launches = [k for op in profile.operators for k in op.kernels]
    assert sum(k.unprofiled_gap_ns is not None for k in launches) >= len(launches) - 3
    # against the eager baseline's committed profile, the replayed LSTM pairs with the eager one
    baseline = OperatorAttributedProfile.model_validate_json(
        (REPO / "examples" / "lstm_sequence_encoder" / "profile.json").read_text())
    comparison = compare_profiles(baseline, profile, allow_mismatch=True)
    lstm = [d for d in comparison.operators if d.operator_name == "aten::lstm"]
    assert [d.status for d in lstm] == ["matched"] and lstm[0].match_rule == "name_module_order", "by module too"
    lstm_module = next(m for m in comparison.modules if m.module_path == "lstm")
    assert lstm_module.baseline_time_ns > 0 and lstm_module.optimized_time_ns > 0, "the module pairs on both sides"


def test_a_variant_pass_worth_less_than_its_start_is_not_run(tmp_path_factory, tmp_path, monkeypatch):
    """At the H200's measured pace (0.32 s per kernel) the training script's 164 configurations leave room in 53 s for
    one of its 30 shape variants, holding 0.47 % of the kernel time: a pass of its own would cost more (8 s there)
    than it measures, so none is started and the variant takes its nearest measured shape's counters."""
    run = _recorded("train_script", tmp_path_factory)
    plan = within_budget(plan_replays(RunDir(run).nsys_sqlite()), 53.0, 0.32)
    assert len(plan.variants) == 1 and variant_share(plan) < MIN_VARIANT_SHARE
    assert variant_share(within_budget(plan, 60.0, 0.32)) >= MIN_VARIANT_SHARE, "five variants at 60 s: worth it"
    started = tmp_path / "ncu_started"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\ntouch {started}\nexit 1\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NCU", str(ncu))
    req = CaptureRequest(workload=REPO / "scripts" / "gpu_workloads" / "train_script.py",
                         run_dir=RunDir(tmp_path / "run"), timeout_s=60)
    said: list[str] = []
    assert ncu_variants_pass(req, NcuOptions(replay_budget_s=53.0), said.append, plan=plan) is None
    assert not started.exists(), "no ncu was started"
    assert any("not run" in line and "0.47 %" in line for line in said), said


def test_a_script_that_compiles_its_own_model_is_attributed_through_the_graphs_it_compiled(tmp_path_factory):
    """scripts/gpu_workloads/amp_compiled_train.py on an H200 (`run --script`, nsys pass): the script wraps its model
    in torch.compile and trains it under float16 autocast. Each pass compiled the model once, with no graph break of
    ours, and every generated kernel takes its module from the graphs the script compiled."""
    run = _recorded("amp_compiled_train", tmp_path_factory, "h200")
    for name in ("nsys", "timing"):
        harness = json.loads((run / name / "harness.json").read_text())
        assert harness["graph_breaks"] == [] and harness["root_module"] == "TinyGPT"
        graphs = json.loads((run / name / "inductor_provenance.json").read_text())["graphs"]
        assert [g["kind"] for g in graphs] == ["dynamo", "forward", "backward"]
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct == 100.0 and profile.capture_metadata.root_module == "TinyGPT"
    generated = [(op, k) for op in profile.operators for k in op.kernels if k.kernel_name.startswith("triton_")]
    assert len(generated) > 100 and {op.phase for op, _ in generated} == {"forward", "backward"}
    assert all(op.compiled_graph is not None and op.module_path for op, _ in generated)
    assert sum(op.module_path.startswith("blocks.") for op, _ in generated) > len(generated) / 2
    assert "OptimizedModule" not in {op.module_path for op in profile.operators}
    # the compiled backward differentiates the compiled forward (the custom Function's range, seq included), not the
    # last aten op that carried its number (a slice of the script's batch)
    compiled = [op for op in profile.operators if op.autograd_node == "CompiledFunctionBackward"]
    assert len(compiled) > 100 and {op.forward_op for op in compiled} == {"CompiledFunction"}


def test_a_scripts_cuda_graph_trees_replay_its_backward_graph_in_the_backward_phase(tmp_path_factory):
    """The same script compiled with `mode="reduce-overhead"` on an H200 (nsys pass): CUDA-graph trees replay its
    forward and backward graphs. The backward graph's library kernels (cuBLAS, cuDNN's attention backward) were
    captured on autograd's thread outside the engine's marker; replayed inside it, they are backward work, as the
    graph's generated kernels are (they were labelled forward before)."""
    run = _recorded("amp_graphs_train", tmp_path_factory, "h200")
    graphs = json.loads((run / "nsys" / "inductor_provenance.json").read_text())["graphs"]
    kinds = {g["fx_graph_cache_key"]: g["kind"] for g in graphs if g["kind"] != "dynamo"}
    assert sorted(kinds.values()) == ["backward", "forward"]
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct == 100.0
    replayed = [op for op in profile.operators if op.compiled_graph in kinds]
    assert {op.phase for op in replayed if kinds[op.compiled_graph] == "backward"} == {"backward"}
    assert {op.phase for op in replayed if kinds[op.compiled_graph] == "forward"} == {"forward"}
    library = ("aten::mm", "aten::_scaled_dot_product_cudnn_attention_backward")  # cuBLAS's and cuDNN's kernels
    gradients = [op for op in replayed if kinds[op.compiled_graph] == "backward" and op.operator_name in library]
    assert {op.operator_name for op in gradients} == set(library)
    assert all(op.module_path for op in gradients)  # the layer each differentiates


def test_what_the_timing_pass_says_of_itself_reaches_the_profile(tmp_path_factory, tmp_path):
    """The timing pass's own warnings (why it measured fewer windows, or traced none) are in the profile, marked as
    its: the H200 recording of the compiled training script, its timing pass's harness.json given the warning a
    script that ends early makes it write."""
    run = tmp_path / "run"
    shutil.copytree(_recorded("amp_compiled_train", tmp_path_factory, "h200"), run)
    path = run / "timing" / "harness.json"
    harness = json.loads(path.read_text())
    said = "the script ended after 9 steps: 5 of 7 windows of 1 step(s) were measured"
    path.write_text(json.dumps({**harness, "warnings": [*harness.get("warnings", []), said]}))
    profile = assemble(RunDir(run))
    assert f"timing pass: {said}" in profile.warnings


def test_an_hf_decode_loops_variant_pass_pays_its_warm_up_from_the_budget(tmp_path_factory):
    run = _recorded("decode_loop_hf", tmp_path_factory, gpu="h200")
    plan = plan_replays(RunDir(run).nsys_sqlite())
    measured = json.loads((REPO / "docs" / "measurements" / "h200_unseen_workloads.json").read_text())
    row = next(r for r in measured["sixteenth_stop"]["issue40_targets_again"]["rows"] if r["case"] == "decode_loop_hf")
    ncu, variants = row["pass_phases"]["ncu"], row["pass_phases"]["ncu_variants"]
    pace = (ncu["finish"] - ncu["measure"]) / plan.configurations  # the main pass's replay, measured on the H200
    warm = ncu["waiting for the GPU lock (window)"] - ncu["warmup"]  # its one generate() call under ncu
    assert 9.0 < warm < 13.0 and variants["measure"] - variants["warmup"] == pytest.approx(warm, rel=0.2), (
        "the variant pass warms up as long as the main pass did")
    before = within_budget(plan, 60.0, pace)
    paid = within_budget(plan, 60.0, pace, warm)
    assert len(paid.replayed) < len(before.replayed) and paid.variants
    assert (paid.configurations + len(paid.replayed)) * pace + warm <= 60.0
    assert (before.configurations + len(before.replayed)) * pace + warm > 60.0, "the budget was overspent before"
