"""Analysis rules on tiny inline tables: classes, roofline artifacts, device table, stalls, estimates' bounds."""

from __future__ import annotations

import math

import pytest

from mcp_server.analysis.classify import classify_kernel
from mcp_server.analysis.devices import match_device, peak_at_clock, precision_key, spec_from_entry
from mcp_server.analysis.diagnosis import diagnose
from mcp_server.analysis.roofline import roofline_from_counts
from mcp_server.analysis.rules import knowledge, rule
from mcp_server.analysis.shapes import gemm_flops_and_bytes, minimum_bytes
from mcp_server.analysis.stalls import stall_breakdown
from mcp_server.schema.analysis import Bottleneck, KernelAnalysis, TimelineHealth
from mcp_server.schema.profile import Attribution, AttributionMethod, Confidence, KernelRecord, Metric, OperatorRecord


def _kernel(duration_ns: int = 50_000, **metrics: float) -> KernelRecord:
    return KernelRecord(
        kernel_id=0, kernel_name="k", start_ns=0, duration_ns=duration_ns,
        attribution=Attribution(method=AttributionMethod.NVTX_ENCLOSURE, confidence=Confidence.MEDIUM),
        metrics={k: Metric(value=v, unit="%" if k.endswith("_pct") else "") for k, v in metrics.items()},
    )


@pytest.mark.parametrize(
    ("metrics", "expected", "trigger"),
    [
        ({"sm_throughput_pct": 85.0, "memory_throughput_pct": 40.0}, Bottleneck.COMPUTE, "sm_throughput_pct=85.0"),
        ({"sm_throughput_pct": 20.0, "memory_throughput_pct": 88.0, "dram_throughput_pct": 86.0}, Bottleneck.MEMORY,
         "dram_throughput_pct=86.0"),
        ({"sm_throughput_pct": 70.0, "memory_throughput_pct": 65.0}, Bottleneck.COMPUTE, "balanced=compute_and_memory"),
        ({"sm_throughput_pct": 59.9, "memory_throughput_pct": 12.0, "waves_per_sm": 0.5}, Bottleneck.LATENCY,
         "waves_per_sm=0.500"),
        ({"sm_throughput_pct": 30.0, "memory_throughput_pct": 45.0, "achieved_occupancy_pct": 10.0},
         Bottleneck.LATENCY, "achieved_occupancy_pct=10.0"),
    ],
)
def test_speed_of_light_classes(metrics, expected, trigger):
    # Thresholds from bottleneck_rules.yaml: >= 60 % on the larger of SM/memory is bound; < 10 points apart balanced.
    assert rule("speed_of_light", "well_utilised_pct") == 60 and rule("speed_of_light", "balanced_diff_pct") == 10
    cls, reasons = classify_kernel(_kernel(**metrics), gap_before_ns=100)
    assert cls == expected and trigger in reasons


def test_launch_overhead_needs_a_tiny_kernel_and_a_longer_wait():
    counters = {"sm_throughput_pct": 1.0, "memory_throughput_pct": 1.0}
    assert classify_kernel(_kernel(4_000, **counters), gap_before_ns=4_000)[0] == Bottleneck.LAUNCH_OVERHEAD
    assert classify_kernel(_kernel(4_000, **counters), gap_before_ns=3_999)[0] == Bottleneck.LATENCY
    assert classify_kernel(_kernel(6_000, **counters), gap_before_ns=60_000)[0] == Bottleneck.LATENCY
    assert classify_kernel(_kernel(4_000), gap_before_ns=10_000)[0] == Bottleneck.LAUNCH_OVERHEAD  # no counters
    assert classify_kernel(_kernel(40_000), gap_before_ns=10_000) == (Bottleneck.UNKNOWN, ["counters=none"])


def _h100():
    spec = match_device("NVIDIA H100 80GB HBM3")
    assert spec is not None and spec.key == "h100_sxm"
    return spec


def test_roofline_percentages_by_hand():
    spec = _h100()
    # 1e9 FP32 FLOPs and 1e6 bytes in 100 us at 1590 MHz: roof 66.9e12 * 1590/1980 FLOP/s, 3.35e12 bytes/s.
    roof = roofline_from_counts({"fp32": 1e9}, 1e6, 100_000.0, 1590.0, spec)
    fp32_roof = 66.9e12 * 1590 / 1980
    assert roof.compute_pct_of_peak == pytest.approx(100 * 1e9 / 1e-4 / fp32_roof)
    assert roof.dram_pct_of_peak == pytest.approx(100 * 1e6 / 1e-4 / 3.35e12)
    assert roof.roof == "compute" and roof.pct_of_roof == roof.compute_pct_of_peak and roof.artifact is None
    assert roof.ridge_flop_per_byte == pytest.approx(fp32_roof / 3.35e12)
    # Memory side: 1e6 FLOPs over 1e8 bytes in 100 us is 29.9 % of DRAM bandwidth.
    memory = roofline_from_counts({"fp32": 1e6}, 1e8, 100_000.0, 1590.0, spec)
    assert memory.roof == "memory" and memory.pct_of_roof == pytest.approx(100 * 1e8 / 1e-4 / 3.35e12)
    # The most utilised precision names the roof: tensor BF16 at 989.4 TFLOP/s quoted at 1830 MHz.
    mixed = roofline_from_counts({"fp32": 1e6, "tensor_bf16": 5e10}, 1e6, 100_000.0, 1830.0, spec)
    assert mixed.precision == "bf16_tensor"
    assert mixed.compute_pct_of_peak == pytest.approx(100 * 5e10 / 1e-4 / 989.4e12)


def test_rates_above_a_peak_are_flagged_then_clamped():
    spec = _h100()
    # 4e12 bytes/s is above the H100's 3.35 TB/s: inconsistent counters, flagged and clamped to 100 %.
    roof = roofline_from_counts({}, 4e6, 1_000.0, 1590.0, spec)
    assert roof.artifact and "DRAM rate" in roof.artifact and roof.dram_pct_of_peak == 100.0
    assert roof.pct_of_roof == 100.0
    sane = roofline_from_counts({}, 3e6, 1_000.0, 1590.0, spec)
    assert sane.artifact is None and sane.dram_pct_of_peak == pytest.approx(100 * 3e6 / 1e-6 / 3.35e12)
    assert roofline_from_counts({}, -5.0, 1_000.0, 1590.0, spec).artifact.startswith("negative DRAM bytes")


@pytest.mark.parametrize(
    ("reported", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100_sxm"), ("NVIDIA H100 PCIe", "h100_pcie"), ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100_80gb_sxm"), ("NVIDIA A100 80GB PCIe", "a100_80gb_pcie"),
        ("NVIDIA A100-SXM4-40GB", "a100_40gb"), ("NVIDIA A100-PCIE-40GB", "a100_40gb"), ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "rtx_4090"), ("NVIDIA B200", "b200"),
        ("NVIDIA H200 NVL", None), ("NVIDIA L40", None), ("NVIDIA GeForce RTX 4090 D", None), (None, None),
    ],
)
def test_device_names_match_explicitly(reported, key):
    spec = match_device(reported)
    assert (spec.key if spec else None) == key


def test_published_peaks_are_whole_per_clock_rates():
    """Each dense peak over (SMs x quoted clock) is a power of two FLOP/clock/SM within 2 %: catches typos."""
    checked = 0
    for key, entry in knowledge("devices")["devices"].items():
        spec = spec_from_entry(key, entry)
        assert spec.source and spec.sm_count and spec.dram_bandwidth_bytes_per_s, key
        for precision, peak in spec.peak_flop_per_s.items():
            clock = spec.peak_clock_mhz.get(precision)
            if clock is None:
                continue
            per_clock = peak / (spec.sm_count * clock * 1e6)
            nearest = 2 ** round(math.log2(per_clock))
            assert per_clock == pytest.approx(nearest, rel=0.02), (key, precision, per_clock)
            checked += 1
    assert checked >= 60


def test_peak_rescaling_and_precision_keys():
    spec = _h100()
    assert peak_at_clock(spec, "tf32_tensor", 1830.0) == pytest.approx(494.7e12)
    assert peak_at_clock(spec, "tf32_tensor", 1590.0) == pytest.approx(494.7e12 * 1590 / 1830)
    assert peak_at_clock(spec, "fp32", None) == pytest.approx(66.9e12)
    assert peak_at_clock(spec, "fp8_tensor", 1000.0) == pytest.approx(1978.9e12 * 1000 / 1830)
    keys = {"fp64": "fp64", "fp32": "fp32", "fp16": "fp16", "tensor_fp64": "fp64_tensor",
            "tensor_tf32": "tf32_tensor", "tensor_bf16": "bf16_tensor", "tensor_fp16": "fp16_tensor",
            "tensor_fp8": "fp8_tensor"}
    assert {k: precision_key(k) for k in keys} == keys
    a100 = match_device("NVIDIA A100-SXM4-40GB")
    assert "fp8_tensor" not in a100.peak_flop_per_s  # null in the table: no FP8 on Ampere


def test_stall_rule_follows_nsight_compute():
    stalls = {"stall_long_scoreboard": 6.0, "stall_barrier": 2.0, "stall_wait": 1.0, "stall_short_scoreboard": 1.0}
    flagged = stall_breakdown(_kernel(**stalls, issue_active_pct=20.0))
    assert flagged.dominant == "stall_long_scoreboard" and flagged.dominant_share_pct == pytest.approx(60.0)
    assert flagged.flagged and "L1TEX" in flagged.cause and flagged.fix
    busy = stall_breakdown(_kernel(**stalls, issue_active_pct=85.0))
    assert not busy.flagged  # issue slots busy >= 80 %: not a latency problem
    spread = stall_breakdown(_kernel(stall_long_scoreboard=1.0, stall_barrier=1.0, stall_wait=1.0,
                                     stall_short_scoreboard=1.0, issue_active_pct=20.0))
    assert spread.dominant_share_pct == pytest.approx(25.0) and not spread.flagged
    assert stall_breakdown(_kernel()) is None


def test_gemm_shapes():
    linear = OperatorRecord(operator_id="aten::linear#0", operator_name="aten::linear", call_index=0,
                            input_shapes=[[4, 128, 768], [3072, 768], [3072]], input_dtypes=["float", "float", "float"])
    flops, moved = gemm_flops_and_bytes(linear)
    assert flops == 2 * 512 * 3072 * 768
    assert moved == 4 * (4 * 128 * 768 + 3072 * 768 + 3072 + 512 * 3072)
    bmm = OperatorRecord(operator_id="aten::bmm#0", operator_name="aten::bmm", call_index=0,
                         input_shapes=[[8, 16, 32], [8, 32, 16]], input_dtypes=["c10::BFloat16", "c10::BFloat16"])
    assert gemm_flops_and_bytes(bmm) == (2 * 8 * 16 * 16 * 32, 2 * (8 * 16 * 32 * 2 + 8 * 16 * 16))
    relu = OperatorRecord(operator_id="aten::relu#0", operator_name="aten::relu", call_index=0, input_shapes=[[4]])
    assert gemm_flops_and_bytes(relu) is None



def test_the_least_bytes_a_convolution_moves_are_its_input_and_weight():
    """A 1x1 convolution of the Fourier operator's width (64 channels, 16 fields of 128x128, float32): its output's
    size needs the stride and padding the shapes lack, but its input and weight are read at least once."""
    conv = OperatorRecord(operator_id="aten::conv2d#0", operator_name="aten::conv2d", call_index=0,
                          input_shapes=[[16, 64, 128, 128], [64, 64, 1, 1], [64]],
                          input_dtypes=["float", "float", "float"])
    assert minimum_bytes(conv) == 4 * (16 * 64 * 128 * 128 + 64 * 64)
    linear = OperatorRecord(operator_id="aten::linear#0", operator_name="aten::linear", call_index=0,
                            input_shapes=[[4, 128, 768], [3072, 768], [3072]], input_dtypes=["float", "float", "float"])
    assert minimum_bytes(linear) == gemm_flops_and_bytes(linear)[1]  # type: ignore[index]
    relu = OperatorRecord(operator_id="aten::relu#0", operator_name="aten::relu", call_index=0, input_shapes=[[4]])
    assert minimum_bytes(relu) is None

def _health(window_ns: int, busy_ns: int, window_range_ns: list[int] | None, tiny_pct: float) -> TimelineHealth:
    return TimelineHealth(
        window_ns=window_ns, window_source="no profiler", unprofiled=True, wall_time_ns=window_ns, gpu_busy_ns=busy_ns,
        gpu_utilization_pct=100.0 * busy_ns / window_ns, idle_ns=window_ns - busy_ns, kernel_count=200,
        kernel_time_ns=busy_ns, tiny_kernel_pct=tiny_pct, launch_bound_kernel_pct=20.0, window_range_ns=window_range_ns,
    )


def _classed(latency_ns: int, memory_ns: int) -> list[KernelAnalysis]:
    return [KernelAnalysis(kernel_id=0, kernel_name="a", start_ns=0, duration_ns=latency_ns,
                           bottleneck=Bottleneck.LATENCY),
            KernelAnalysis(kernel_id=1, kernel_name="b", start_ns=latency_ns, duration_ns=memory_ns,
                           bottleneck=Bottleneck.MEMORY)]


def test_a_verdict_that_changes_within_the_windows_spread_says_so():
    """A host-sensitive window (gpt2 eager's five ran 6.5-10.0 ms in one timing pass on an H100): at the median,
    8.0 ms and 62.5 % busy with less idle time than latency-bound kernel time, it is GPU-bound; at its longest
    it would be busy under 50 % and launch-bound."""
    kernels = _classed(4_000_000, 1_000_000)
    diagnosis = diagnose(_health(8_000_000, 5_000_000, [6_000_000, 10_500_000], tiny_pct=60.0), kernels, [], True)
    assert diagnosis.bottleneck is Bottleneck.LATENCY
    assert diagnosis.borderline == ("Borderline: the windows measured without the profiler ran 6.000 ms to 10.500 ms "
                                    "(GPU busy 83 to 48 %), and at 10.500 ms the verdict would be launch_overhead.")
    assert diagnosis.root_cause.endswith(diagnosis.borderline)
    assert "window_range_ns=6000000-10500000" in diagnosis.triggers
    # the other way round: host-bound at the median, GPU-bound at the shortest window
    host = diagnose(_health(10_500_000, 5_000_000, [8_000_000, 11_000_000], tiny_pct=60.0), kernels, [], True)
    assert host.bottleneck is Bottleneck.LAUNCH_OVERHEAD
    assert host.borderline is not None and host.borderline.endswith("at 8.000 ms the verdict would be latency.")


def test_a_verdict_that_holds_across_the_spread_or_without_one_is_not_borderline():
    kernels = _classed(4_000_000, 1_000_000)
    for window_range in ([7_800_000, 8_300_000], None):
        diagnosis = diagnose(_health(8_000_000, 5_000_000, window_range, tiny_pct=60.0), kernels, [], True)
        assert diagnosis.bottleneck is Bottleneck.LATENCY
        assert diagnosis.borderline is None and "Borderline" not in diagnosis.root_cause
        assert not [t for t in diagnosis.triggers if t.startswith("window_range_ns")]
