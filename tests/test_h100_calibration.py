"""Estimates against measurements, on profiles recorded on the H100 with the timing pass.

`fixtures/h100_timing_profiles/` holds the profile.json of eager runs of the examples and of the workloads in
`scripts/gpu_workloads/` (recorded by `benchmarks/benchmark_targets.py --profiles`; xz-compressed). Each change was
also applied alone and benched against eager on the same kind of GPU (`benchmarks/calibrate_estimates.py`; the rows
are in docs/measurements/). These tests hold the analysis to those numbers: no verdict contradicts the window
measured without the profiler, no estimate exceeds what that window allows, no measured speedup exceeds the
plausible speed-of-light ceiling, and the published calibration table is the current analysis's.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from mcp_server.schema.analysis import Analysis, Bottleneck

REPO = Path(__file__).resolve().parents[1]
PROFILES = sorted((REPO / "tests" / "fixtures" / "h100_timing_profiles").glob("*_eager.json.xz"))
MEASURED = [REPO / "docs" / "measurements" / name for name in
            ("h100_calibration_examples_bench.json", "h100_calibration_own_bench.json")]
TABLE = REPO / "docs" / "measurements" / "h100_calibration.json"


def _table_script():
    spec = importlib.util.spec_from_file_location("calibration_table", REPO / "benchmarks" / "calibration_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("calibration_table", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def analyses() -> dict[str, Analysis]:
    """workload -> the current analysis of its recorded profile, each made once."""
    script = _table_script()
    return dict(script.analyse(path) for path in PROFILES)


@pytest.fixture(params=[p.name.split(".")[0].removesuffix("_eager") for p in PROFILES])
def analysed(request, analyses) -> tuple[str, Analysis]:
    return request.param, analyses[request.param]


def test_ten_workloads_were_recorded():
    names = {p.name.split(".")[0] for p in PROFILES}
    assert len(names) == 10
    assert {"resnet50_eager", "encoder_train_step_train_eager", "graph_breaks_eager"} <= names


def test_window_numbers_come_from_the_timing_pass(analysed):
    _, analysis = analysed
    timeline = analysis.timeline
    assert timeline is not None and timeline.unprofiled
    assert timeline.window_source.startswith("no profiler")
    assert 0 < timeline.gpu_busy_ns <= timeline.window_ns


def test_no_verdict_contradicts_the_unprofiled_window(analysed):
    _, analysis = analysed
    timeline = analysis.timeline
    assert timeline is not None
    host = {Bottleneck.LAUNCH_OVERHEAD, Bottleneck.HOST}
    if timeline.gpu_utilization_pct >= 90:
        assert analysis.diagnosis.bottleneck not in host
    if timeline.gpu_utilization_pct < 50:
        assert analysis.diagnosis.bottleneck in host


def test_no_estimate_exceeds_what_the_window_allows(analysed):
    _, analysis = analysed
    timeline = analysis.timeline
    assert timeline is not None
    for opportunity in analysis.opportunities:
        assert 0 < opportunity.estimated_saving_ns < timeline.window_ns
        assert "estimate" in opportunity.estimate_label
        if opportunity.change_class == "cuda_graphs":
            assert opportunity.estimated_saving_ns <= timeline.idle_ns


def test_the_speed_of_light_is_below_the_window(analysed):
    _, analysis = analysed
    sol = analysis.speed_of_light
    assert sol is not None
    assert sol.plausible_floor_ns <= sol.reduced_precision_floor_ns <= sol.floor_ns < sol.window_ns


def test_no_measured_speedup_exceeds_the_plausible_ceiling(analysed):
    name, analysis = analysed
    assert analysis.speed_of_light is not None
    ceiling = analysis.speed_of_light.max_plausible_speedup
    rows = [r for file in MEASURED for r in json.loads(file.read_text()) if r.get("workload") == name]
    for row in rows:
        if "measured_speedup" in row:
            assert row["measured_speedup"] <= ceiling, (row["change_class"], ceiling)


def test_the_published_calibration_table_is_the_current_analysis(analyses):
    script = _table_script()
    measured = script._measured(MEASURED)
    rows = [r for name, analysis in analyses.items() for r in script.rows_of(name, analysis, measured)]
    regenerate = "regenerate it: python benchmarks/calibration_table.py (see its --help)"
    assert rows == json.loads(TABLE.read_text()), regenerate
    benched = [r for r in rows if "measured_speedup" in r]
    assert len(benched) >= 12


def test_the_diagnosis_is_led_by_an_operator_of_its_own_class(analysed):
    _, analysis = analysed
    led = re.search(r"led by (\S+) \(", analysis.diagnosis.root_cause)
    if led is None:
        return
    classes = {k.bottleneck for k in analysis.kernels if k.operator_id == led.group(1)}
    assert analysis.diagnosis.bottleneck in classes, (led.group(1), classes)


def test_a_kernel_said_bound_by_dram_uses_dram_most(analysed):
    _, analysis = analysed
    for k in analysis.kernels:
        issue = next((r.split("=", 1)[1] for r in k.reasons if r.startswith("key_issue=")), "")
        if issue.startswith("memory-bound, DRAM"):
            assert k.memory_throughput_pct is not None and k.dram_throughput_pct is not None
            assert k.memory_throughput_pct - k.dram_throughput_pct < 10, (k.kernel_name, issue)
        elif issue.startswith("memory-bound on chip"):
            assert k.memory_throughput_pct is not None and k.dram_throughput_pct is not None
            assert k.memory_throughput_pct - k.dram_throughput_pct >= 10, (k.kernel_name, issue)


def test_the_plausible_floor_keeps_the_kernels_no_compiler_fuses(analyses):
    """cuDNN's LSTM kernels stay in the plausibility floor, one launch each at least (not fused away)."""
    analysis = analyses["lstm_sequence_encoder"]
    assert analysis.speed_of_light is not None
    rnn = [k for k in analysis.kernels if k.operator_name == "aten::lstm"]
    assert len(rnn) > 100
    assert analysis.speed_of_light.plausible_floor_ns >= 1000 * len(rnn)  # launch_floor_ns per kernel


def test_inductor_s_bound_counts_unfused_attention(analyses):
    for name, analysis in analyses.items():
        attention = any(f.kind in ("unfused_attention", "sdpa_math_path") for f in analysis.findings)
        inductor = next((o for o in analysis.opportunities if o.change_class == "inductor_config"), None)
        if inductor is None:
            continue
        counted = next(int(t.split("=")[1]) for t in inductor.triggers if t.startswith("attention_kernels="))
        assert (counted > 0) == attention, name


def test_one_change_is_one_opportunity_whatever_evidence_calls_for_it(analyses):
    for name, analysis in analyses.items():
        classes = [o.change_class for o in analysis.opportunities]
        assert len(classes) == len(set(classes)), (name, classes)
    # conv_block: cuDNN converts 14 tensors to NHWC and back around its TF32 convolutions, and one convolution still
    # runs FP32 on CUDA cores in NCHW: both call for channels_last, one change, one estimate over both
    (layout,) = [o for o in analyses["conv_block"].opportunities if o.change_class == "channels_last"]
    assert layout.findings == ["fp32_conv", "layout_conversion"] and "cudnn_layout_kernels=14" in layout.triggers
    (resnet,) = [o for o in analyses["resnet50"].opportunities if o.change_class == "channels_last"]
    assert resnet.title.startswith("Convert model and input to channels_last once (64 copies)")
