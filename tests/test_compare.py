"""compare: identity matching, fused absorption, appeared/disappeared, refusals, CPU-only profiles, output files."""

from __future__ import annotations

import json
import lzma

import pytest

from mcp_server.compare import ProfileMismatch, compare_paths, compare_profiles, normalize_op_name, total
from mcp_server.errors import ProfilerError
from mcp_server.render.comparison import render_comparison_markdown, summary_line, write_comparison
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.profile import (
    AggregatedMetrics,
    Attribution,
    AttributionMethod,
    CaptureMetadata,
    Confidence,
    KernelRecord,
    OperatorAttributedProfile,
    OperatorRecord,
    WindowTotals,
)
from mcp_server.schema.proof import Comparison

H100 = "NVIDIA H100 80GB HBM3"


def _meta(**overrides: object) -> CaptureMetadata:
    fields: dict[str, object] = dict(
        tool="torch_profiler", gpu_used=True, device_name=H100, device_type="cuda", torch_version="2.13.0",
        python_version="3.11.7", python_executable="python", workload="w.py", compile_mode="eager",
        run_mode="inference", warmup_iters=1, iters=1, seed=0, command_line=["operator-profiler"],
        started_at="2026-11-21T00:00:00+00:00", finished_at="2026-11-21T00:00:01+00:00",
    )
    fields.update(overrides)
    return CaptureMetadata(**fields)


class _Builder:
    """Hand-written profiles: operators in window order, each with its kernels (name, ns)."""

    def __init__(self) -> None:
        self.ops: list[OperatorRecord] = []
        self.kernel_id = 0
        self.calls: dict[str, int] = {}

    def op(
        self, name: str, module: str | None, kernels: list[tuple[str, int]] = (), shape: list[int] | None = None,
        fused: list[str] | None = None, dram: float | None = None, occupancy: float | None = None,
        cpu: tuple[int, int] | None = None,
    ) -> _Builder:
        records = []
        for kernel_name, ns in kernels:
            records.append(KernelRecord(
                kernel_id=self.kernel_id, kernel_name=kernel_name, start_ns=self.kernel_id * 10_000, duration_ns=ns,
                module_path=module,
                attribution=Attribution(method=AttributionMethod.KINETO_CORRELATION, confidence=Confidence.HIGH),
            ))
            self.kernel_id += 1
        index = self.calls.get(name, 0)
        self.calls[name] = index + 1
        self.ops.append(OperatorRecord(
            operator_id=f"{name}#{index}", operator_name=name, call_index=index, module_path=module,
            input_shapes=[shape] if shape else None, is_fused=fused is not None, fused_operators=fused or [],
            kernels=records,
            aggregated=AggregatedMetrics(
                total_duration_ns=sum(ns for _, ns in kernels), kernel_count=len(records),
                dram_bytes_read=dram, achieved_occupancy_pct=occupancy,
                cpu_total_time_ns=cpu[0] if cpu else None, cpu_self_time_ns=cpu[1] if cpu else None,
            ),
        ))
        return self

    def build(self, wall_ns: int = 1_000_000, **meta: object) -> OperatorAttributedProfile:
        kernels = [k for op in self.ops for k in op.kernels]
        return OperatorAttributedProfile(
            capture_metadata=_meta(**meta),
            window=WindowTotals(
                wall_time_ns=wall_ns, kernel_count=len(kernels), kernel_time_ns=sum(k.duration_ns for k in kernels),
                operator_count=len(self.ops),
            ),
            operators=self.ops,
        )


def _mlp_baseline() -> OperatorAttributedProfile:
    return (
        _Builder()
        .op("aten::linear", "fc1", [("sgemm_128", 4_000)], shape=[8, 16], dram=1e6, occupancy=50.0)
        .op("aten::relu", "act", [("elementwise_relu", 1_000)], shape=[8, 32])
        .op("aten::dropout", "drop", [("dropout_kernel", 500)], shape=[8, 32])
        .op("aten::linear", "fc2", [("sgemm_64", 3_000)], shape=[8, 32])
        .op("aten::add", "blocks.0", [("add_kernel", 200)], shape=[8, 4])
        .op("aten::add", "blocks.0", [("add_kernel", 300)], shape=[8, 4])
        .build(wall_ns=2_000_000)
    )


def test_operator_names_normalize_across_spellings():
    assert normalize_op_name("aten.add.Tensor") == "aten::add"
    assert normalize_op_name("aten::add.Tensor") == "aten::add"
    assert normalize_op_name("aten::relu") == "aten::relu"
    assert normalize_op_name("triton_poi_fused_relu_0") == "triton_poi_fused_relu_0"


def test_identity_matching_by_name_module_and_call_order():
    optimized = (
        _Builder()
        .op("aten::linear", "fc1", [("sgemm_128", 2_000)], shape=[8, 16], dram=5e5, occupancy=70.0)
        .op("aten::relu", "act", [("elementwise_relu", 1_000)], shape=[8, 32])
        .op("aten::linear", "fc2", [("sgemm_64", 3_000)], shape=[8, 32])
        .op("aten::add", "blocks.0", [("add_kernel", 100)], shape=[8, 4])
        .op("aten::add", "blocks.0", [("add_kernel", 300)], shape=[8, 4])
        .build(wall_ns=1_500_000)
    )
    c = compare_profiles(_mlp_baseline(), optimized)
    matched = {(d.operator_name, d.module_path, d.call_order): d for d in c.operators if d.status == "matched"}
    assert len(matched) == 5
    fc1 = matched[("aten::linear", "fc1", 0)]
    assert (fc1.baseline.time_ns, fc1.optimized.time_ns, fc1.time_delta_ns) == (4_000, 2_000, -2_000)
    assert fc1.time_ratio == pytest.approx(0.5)
    assert fc1.baseline.dram_bytes == 1e6 and fc1.optimized.dram_bytes == 5e5
    assert fc1.optimized.counters == {"achieved_occupancy_pct": 70.0}
    # The two calls of aten::add in blocks.0 pair up in call order, not by time.
    first_add, second_add = matched[("aten::add", "blocks.0", 0)], matched[("aten::add", "blocks.0", 1)]
    assert (first_add.baseline.time_ns, first_add.optimized.time_ns) == (200, 100)
    assert (second_add.baseline.time_ns, second_add.optimized.time_ns) == (300, 300)
    assert first_add.baseline_operator_ids == ["aten::add#0"] and second_add.baseline_operator_ids == ["aten::add#1"]
    assert [d.operator_name for d in c.operators if d.status == "disappeared"] == ["aten::dropout"]
    assert c.match_counts == {"matched": 5, "fused": 0, "appeared": 0, "disappeared": 1}
    kernel_time = total(c, "gpu_kernel_time_ns")
    assert (kernel_time.baseline, kernel_time.optimized) == (9_000, 6_400)
    assert kernel_time.speedup == pytest.approx(9_000 / 6_400)
    wall = total(c, "window_wall_time_ns")
    assert wall.ratio == pytest.approx(0.75) and wall.speedup == pytest.approx(2_000_000 / 1_500_000)
    assert total(c, "kernel_count").delta == -1
    dropout = next(k for k in c.kernels if k.kernel_name == "dropout_kernel")
    assert (dropout.status, dropout.baseline_count, dropout.optimized_count) == ("disappeared", 1, 0)
    adds = next(k for k in c.kernels if k.kernel_name == "add_kernel")
    assert (adds.status, adds.baseline_time_ns, adds.optimized_time_ns) == ("unchanged", 500, 400)
    modules = {m.module_path: m for m in c.modules}
    assert modules["fc1"].time_delta_ns == -2_000 and modules["drop"].optimized_operator_count == 0


def test_fused_operator_absorbs_baseline_ops_by_name_then_by_module():
    baseline = (
        _Builder()
        .op("aten::conv2d", "features.0.conv", [("implicit_gemm", 10_000)], shape=[2, 3, 32, 32])
        .op("aten::batch_norm", "features.0.bn", [("bn_fw_inf", 3_000)], shape=[2, 8, 32, 32])
        .op("aten::relu_", "features.0.relu", [("elementwise_relu", 2_000)], shape=[2, 8, 32, 32])
        .op("aten::relu_", "features.1.relu", [("elementwise_relu", 2_000)], shape=[2, 8, 32, 32])
        .build()
    )
    optimized = (
        _Builder()
        .op("aten::conv2d", "features.0.conv", [("implicit_gemm", 10_000)], shape=[2, 3, 32, 32])
        # Inductor lists the decomposed batch norm and the out-of-place relu: both match by operator family.
        .op("triton_poi_fused_bn_relu_0", "features.0", [("triton_poi_fused_bn_relu_0", 2_500)],
            fused=["aten._native_batch_norm_legit_no_training.default", "aten.relu_.default"])
        .op("triton_poi_fused_relu_1", "features.1", [("triton_poi_fused_relu_1", 1_000)],
            fused=["aten.relu_.default"])
        .build()
    )
    c = compare_profiles(baseline, optimized)
    fused = {d.operator_name: d for d in c.operators if d.status == "fused"}
    first = fused["triton_poi_fused_bn_relu_0"]
    assert first.match_rule == "fused_names"
    assert sorted(first.absorbed_operators) == ["aten::batch_norm", "aten::relu_"]
    assert sorted(first.baseline_operator_ids) == ["aten::batch_norm#0", "aten::relu_#0"]
    assert (first.baseline.time_ns, first.optimized.time_ns, first.time_delta_ns) == (5_000, 2_500, -2_500)
    second = fused["triton_poi_fused_relu_1"]
    assert second.absorbed_operators == ["aten::relu_"] and second.baseline_operator_ids == ["aten::relu_#1"]
    assert c.match_counts == {"matched": 1, "fused": 2, "appeared": 0, "disappeared": 0}
    kernels = {k.kernel_name: k.status for k in c.kernels}
    assert kernels["bn_fw_inf"] == "disappeared" and kernels["triton_poi_fused_bn_relu_0"] == "appeared"
    assert kernels["implicit_gemm"] == "unchanged"


def test_a_fused_kernel_reused_for_a_sibling_block_finds_the_siblings_calls():
    # Inductor runs one bn+relu kernel for blocks 0 and 1 and both calls carry block 0's module path; a small
    # layout kernel of the parent module lists the same ops. The second call must take block 1's operators.
    baseline = (
        _Builder()
        .op("aten::batch_norm", "features.0.bn", [("bn", 600)]).op("aten::relu_", "features.0.relu", [("relu", 300)])
        .op("aten::batch_norm", "features.1.bn", [("bn", 600)]).op("aten::relu_", "features.1.relu", [("relu", 300)])
        .build()
    )
    bn_relu = ["aten::_native_batch_norm_legit_no_training", "aten::relu"]
    optimized = (
        _Builder()
        .op("triton_bn_relu_2", "features.0", [("triton_bn_relu_2", 270)], fused=bn_relu)
        .op("triton_bn_relu_conv_3", "features", [("triton_bn_relu_conv_3", 2)], fused=[*bn_relu, "aten::convolution"])
        .op("triton_bn_relu_2", "features.0", [("triton_bn_relu_2", 272)], fused=bn_relu)
        .build()
    )
    c = compare_profiles(baseline, optimized)
    got = [(d.status, d.operator_name, d.call_order, d.baseline_operator_ids) for d in c.operators]
    assert got == [
        ("fused", "triton_bn_relu_2", 0, ["aten::batch_norm#0", "aten::relu_#0"]),
        ("appeared", "triton_bn_relu_conv_3", 0, []),
        ("fused", "triton_bn_relu_2", 1, ["aten::batch_norm#1", "aten::relu_#1"]),
    ]


def test_renamed_operators_match_by_module_and_family_in_call_order():
    baseline = (
        _Builder()
        .op("aten::conv2d", "features.0.conv", [("implicit_gemm", 10_000)], shape=[2, 3, 32, 32])
        .op("aten::conv2d", "features.1.conv", [("implicit_gemm", 9_000)], shape=[2, 8, 32, 32])
        .op("aten::linear", "classifier", [("sgemm", 2_000)], shape=[2, 32])
        .build()
    )
    optimized = (
        _Builder()
        .op("aten::convolution", "features.0.conv", [("implicit_gemm_nhwc", 8_000)], shape=[2, 3, 32, 32])
        .op("aten::convolution", "features.1.conv", [("implicit_gemm_nhwc", 7_000)], shape=[2, 8, 32, 32])
        .op("aten::addmm", "classifier", [("sgemm", 2_000)], shape=[10])  # addmm's first argument is the bias
        .build()
    )
    c = compare_profiles(baseline, optimized)
    assert c.match_counts == {"matched": 3, "fused": 0, "appeared": 0, "disappeared": 0}
    renamed = [(d.operator_name, d.baseline_operator_ids, d.match_rule) for d in c.operators]
    assert renamed == [
        ("aten::convolution", ["aten::conv2d#0"], "renamed"),
        ("aten::convolution", ["aten::conv2d#1"], "renamed"),
        ("aten::addmm", ["aten::linear#0"], "renamed"),
    ]
    # A renamed convolution still carries the activation's shape: a different batch is refused.
    bigger = (
        _Builder()
        .op("aten::convolution", "features.0.conv", [("implicit_gemm_nhwc", 8_000)], shape=[4, 3, 32, 32])
        .build()
    )
    with pytest.raises(ProfileMismatch, match=r"features.0.conv \(aten::convolution\): \[2, 3, 32, 32\] vs"):
        compare_profiles(baseline, bigger)


def test_a_fused_kernel_spanning_modules_absorbs_from_each_of_them():
    baseline = (
        _Builder()
        .op("aten::relu_", "features.7.relu", [("relu", 1_000)], shape=[2, 32, 8, 8])
        .op("aten::max_pool2d", "features.8", [("max_pool", 2_000)], shape=[2, 32, 8, 8])
        .op("aten::adaptive_avg_pool2d", "pool", [("reduce", 2_000)], shape=[2, 32, 4, 4])
        .build()
    )
    optimized = (
        _Builder()
        .op("triton_per_fused_max_pool2d_mean_relu_12", "features.7.relu,features.8,pool", [("triton_per", 1_400)],
            fused=["aten::relu", "aten::max_pool2d_with_indices", "aten::mean"])
        .build()
    )
    c = compare_profiles(baseline, optimized)
    (group,) = c.operators
    assert group.status == "fused"
    assert group.absorbed_operators == ["aten::relu_", "aten::max_pool2d", "aten::adaptive_avg_pool2d"]
    assert group.match_rule == "fused_names"  # mean is no alias of adaptive_avg_pool2d: that one went by module


def test_fused_operator_without_a_name_list_absorbs_by_module_path_alone():
    baseline = (
        _Builder()
        .op("aten::mul", "scale", [("mul_kernel", 1_000)], shape=[4, 4])
        .op("aten::add", "scale", [("add_kernel", 1_000)], shape=[4, 4])
        .op("aten::mul", "other", [("mul_kernel", 1_000)], shape=[4, 4])
        .build()
    )
    optimized = (
        _Builder()
        .op("fused_mul_add", "scale", [("triton_fused", 800)], fused=[])
        .op("aten::mul", "other", [("mul_kernel", 1_000)], shape=[4, 4])
        .build()
    )
    c = compare_profiles(baseline, optimized)
    group = next(d for d in c.operators if d.status == "fused")
    assert group.match_rule == "fused_module"
    assert group.absorbed_operators == ["aten::mul", "aten::add"]
    assert group.baseline.time_ns == 2_000 and group.optimized.time_ns == 800
    assert c.match_counts["disappeared"] == 0


def test_appeared_operators_and_new_casts_are_reported():
    optimized = (
        _Builder()
        .op("aten::_to_copy", "fc1", [("cast_fp32_bf16", 300)], shape=[8, 16])
        .op("aten::linear", "fc1", [("sgemm_bf16", 1_500)], shape=[8, 16])
        .op("aten::relu", "act", [("elementwise_relu", 1_000)], shape=[8, 32])
        .op("aten::linear", "fc2", [("sgemm_64", 3_000)], shape=[8, 32])
        .op("aten::add", "blocks.0", [("add_kernel", 200)], shape=[8, 4])
        .op("aten::add", "blocks.0", [("add_kernel", 300)], shape=[8, 4])
        .build()
    )
    c = compare_profiles(_mlp_baseline(), optimized)
    appeared = [d for d in c.operators if d.status == "appeared"]
    assert [(d.operator_name, d.module_path, d.time_delta_ns) for d in appeared] == [("aten::_to_copy", "fc1", 300)]
    assert appeared[0].baseline is None and appeared[0].optimized.kernel_count == 1
    assert c.new_casts == ["aten::_to_copy at fc1 (call 0)"]
    statuses = {k.kernel_name: k.status for k in c.kernels}
    assert statuses["cast_fp32_bf16"] == "appeared" and statuses["sgemm_128"] == "disappeared"


def test_profiles_from_different_devices_are_refused_with_the_reason():
    baseline = _Builder().op("aten::relu", "act", [("relu", 100)], shape=[8]).build()
    optimized = _Builder().op("aten::relu", "act", [("relu", 90)], shape=[8]).build(
        device_name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(ProfileMismatch) as info:
        compare_profiles(baseline, optimized)
    assert isinstance(info.value, ProfilerError)
    assert "different devices" in info.value.message and "A100" in info.value.message
    assert info.value.remedy == "pass --allow-mismatch to compare anyway"


def test_profiles_with_different_input_shapes_are_refused_with_the_module():
    baseline = _mlp_baseline()
    optimized = (
        _Builder()
        .op("aten::linear", "fc1", [("sgemm_128", 8_000)], shape=[16, 16])
        .op("aten::relu", "act", [("elementwise_relu", 2_000)], shape=[16, 32])
        .build()
    )
    with pytest.raises(ProfileMismatch) as info:
        compare_profiles(baseline, optimized)
    assert "different input shapes" in info.value.message
    assert "fc1 (aten::linear): [8, 16] vs [16, 16]" in info.value.message


def test_different_run_modes_and_iteration_counts_are_refused():
    baseline = _Builder().op("aten::relu", "act", [("relu", 100)], shape=[8]).build()
    optimized = _Builder().op("aten::relu", "act", [("relu", 90)], shape=[8]).build(run_mode="train_step", iters=3)
    with pytest.raises(ProfileMismatch) as info:
        compare_profiles(baseline, optimized)
    assert len(info.value.reasons) == 2
    assert "run modes" in info.value.reasons[0] and "iteration counts" in info.value.reasons[1]


def test_allow_mismatch_compares_anyway_and_keeps_the_reasons():
    baseline = _mlp_baseline()
    optimized = (
        _Builder()
        .op("aten::linear", "fc1", [("sgemm_128", 8_000)], shape=[16, 16])
        .build(device_name="NVIDIA A100-SXM4-80GB")
    )
    c = compare_profiles(baseline, optimized, allow_mismatch=True)
    assert c.allow_mismatch
    assert len(c.mismatches) == 2
    assert any("different devices" in m for m in c.mismatches)
    assert any("different input shapes" in m for m in c.mismatches)
    assert "Not like for like" in render_comparison_markdown(c)


def test_cpu_only_profiles_compare_cpu_operator_times():
    baseline = (
        _Builder()
        .op("aten::linear", "fc1", cpu=(50_000, 10_000), shape=[8, 16])
        .op("aten::addmm", "fc1", cpu=(40_000, 40_000), shape=[8, 16])
        .op("aten::relu", "act", cpu=(8_000, 8_000), shape=[8, 32])
        .build(gpu_used=False, device_type="cpu", device_name=None)
    )
    optimized = (
        _Builder()
        .op("aten::linear", "fc1", cpu=(30_000, 5_000), shape=[8, 16])
        .op("aten::addmm", "fc1", cpu=(25_000, 25_000), shape=[8, 16])
        .build(gpu_used=False, device_type="cpu", device_name=None)
    )
    c = compare_profiles(baseline, optimized)
    assert c.time_basis == "cpu_time"
    assert c.kernels == []
    linear = next(d for d in c.operators if d.operator_name == "aten::linear")
    assert (linear.baseline.time_ns, linear.optimized.time_ns) == (50_000, 30_000)
    assert (linear.baseline.cpu_self_time_ns, linear.optimized.cpu_self_time_ns) == (10_000, 5_000)
    # Module and window totals use self time, which does not double count nested operators.
    fc1 = next(m for m in c.modules if m.module_path == "fc1")
    assert (fc1.baseline_time_ns, fc1.optimized_time_ns) == (50_000, 30_000)
    cpu = total(c, "cpu_operator_time_ns")
    assert (cpu.baseline, cpu.optimized) == (58_000, 30_000)
    assert total(c, "gpu_kernel_time_ns") is None
    assert [d.operator_name for d in c.operators if d.status == "disappeared"] == ["aten::relu"]


def test_write_comparison_writes_json_and_markdown(tmp_path):
    baseline_path, optimized_path = tmp_path / "base.json", tmp_path / "opt.json"
    write_model_atomic(baseline_path, _mlp_baseline())
    optimized = (
        _Builder()
        .op("aten::linear", "fc1", [("sgemm_128", 2_000)], shape=[8, 16])
        .op("triton_fused_relu_linear", "", [("triton_fused", 2_500)], fused=["aten.relu", "aten.linear"])
        .build()
    )
    write_model_atomic(optimized_path, optimized)
    c = compare_paths(baseline_path, optimized_path)
    assert c.baseline.path == str(baseline_path.resolve())
    paths = write_comparison(c, tmp_path / "out")
    assert [p.name for p in paths] == ["comparison.json", "comparison.md"]
    again = Comparison.model_validate(json.loads(paths[0].read_text()))
    assert again == c
    markdown = paths[1].read_text()
    for heading in ("# Profile comparison", "## Totals", "## Fused groups", "## Modules", "## Kernels"):
        assert heading in markdown
    assert "gpu_kernel_time_ns" in markdown and "bench" in markdown
    assert "GPU kernel time" in summary_line(c)


def test_a_workload_replaying_its_own_cuda_graph_is_refused_for_that_reason_not_as_another_model(tmp_path):
    """lstm_sequence_encoder's H100 profiles, the optimized one as assembled before graph replays followed their
    clones to the captured node (`h100_lstm_unattributed_replays.profile.json.xz`): the workload replays its whole
    forward from a CUDA graph, and 99.5 % of its kernel time is in kernels no operator range encloses. compare
    names that, not "different models"; with allow_mismatch the totals carry the unattributed time. (Assembled
    now, the same run's replays take their capture's ranges: examples/lstm_sequence_encoder/comparison.json.)"""
    import lzma

    from conftest import REPO
    from fixtures_util import FIXTURES

    from mcp_server.schema.io import load_profile

    folder = REPO / "examples" / "lstm_sequence_encoder"
    replays = tmp_path / "profile_optimized.json"
    replays.write_bytes(lzma.decompress((FIXTURES / "h100_lstm_unattributed_replays.profile.json.xz").read_bytes()))
    baseline, optimized = load_profile(folder / "profile.json"), load_profile(replays)
    with pytest.raises(ProfileMismatch) as info:
        compare_profiles(baseline, optimized)
    assert "99.5 % of the optimized profile's kernel time is in 535 kernels no operator range encloses" in (
        info.value.message)
    assert "different models" not in info.value.message
    c = compare_profiles(baseline, optimized, allow_mismatch=True)
    unattributed = total(c, "unattributed_kernel_time_ns")
    assert unattributed is not None and unattributed.baseline == 0
    assert unattributed.optimized == sum(k.duration_ns for k in optimized.unattributed_kernels)


def test_a_loop_fused_into_one_kernel_lists_what_it_absorbed_by_kind():
    """The Mamba-style SSM on the H200 (tests/fixtures/h200_ssm_comparison.json.xz: eager against reduce-overhead in
    float16): each block's 32-step scan became one Triton kernel absorbing 260 and 262 operator calls. comparison.md
    and report.md name each kind once with its count, not 262 names in a table cell."""
    from fixtures_util import FIXTURES

    from mcp_server.compare.matching import absorbed_summary

    recorded = lzma.decompress((FIXTURES / "h200_ssm_comparison.json.xz").read_bytes())
    comparison = Comparison.model_validate_json(recorded)
    fused = [d for d in comparison.operators if len(d.absorbed_operators) > 100]
    assert sorted(len(d.absorbed_operators) for d in fused) == [260, 262]
    said = absorbed_summary(next(d for d in fused if len(d.absorbed_operators) == 262).absorbed_operators)
    assert said == ("aten::silu, aten::add ×32, aten::softplus, aten::exp ×33, aten::neg, aten::mul ×161 and 2 more "
                    "kind(s) (262 calls)")
    markdown = render_comparison_markdown(comparison)
    assert said in markdown and "aten::mul, aten::mul" not in markdown
