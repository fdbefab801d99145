"""Real runs on this CPU machine: a CPU-only profile analysed, and the peak microbenchmark child."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from mcp_server.analysis import analyze_profile, format_summary, measure_peaks
from mcp_server.analysis.devices import MEASURED_SOURCE
from mcp_server.errors import BackendUnavailable
from mcp_server.schema.analysis import Bottleneck
from mcp_server.schema.io import load_profile


def test_cpu_only_profile_gives_cpu_hotspots_and_says_no_gpu(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "profile", str(REPO / "tests" / "workloads" / "tiny_mlp.py"),
         "--backend", "torch", "-o", str(run), "-q"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(run / "profile.json")
    assert profile.capture_metadata.gpu_used is False
    out = tmp_path / "analysis"
    analysis = analyze_profile(profile, out)
    assert not analysis.gpu_data and not analysis.counters and analysis.device is None
    assert analysis.kernels == [] and analysis.timeline is None and analysis.opportunities == []
    assert analysis.diagnosis.root_cause.startswith("No GPU data exists")
    assert analysis.diagnosis.bottleneck == Bottleneck.UNKNOWN
    # Self time at every depth of the call tree: an outermost call's time splits, without a gap or an overlap,
    # among itself and the operators it called, and the hotspots rank those (aten::linear's time is aten::addmm's).
    for op in profile.operators:
        assert sum(op.aggregated.cpu_self_time_by_operator_ns.values()) == op.aggregated.cpu_total_time_ns
    names = {name for op in profile.operators for name in op.aggregated.cpu_self_time_by_operator_ns}
    assert {h.operator_name for h in analysis.cpu_hotspots} == names
    assert "aten::addmm" in names  # which operator ranks first is a timing: on a loaded CPU, not always the matmul
    self_times = [h.cpu_self_time_ns for h in analysis.cpu_hotspots]
    assert self_times == sorted(self_times, reverse=True)
    assert sum(h.share_of_self_time_pct for h in analysis.cpu_hotspots) == pytest.approx(100.0)
    assert (out / "analysis.json").is_file() and (out / "time_by_operator.png").is_file()
    assert not (out / "trace.json").exists() and not (out / "roofline.png").exists()
    assert any("trace.json not written" in n for n in analysis.notes)
    text = format_summary(analysis)
    assert "NO GPU DATA" in text and analysis.cpu_hotspots[0].operator_name in text
    # aten::addmm runs only inside aten::linear: its outermost calls and total are "-", not a count of 0
    [addmm] = [line.split() for line in text.splitlines() if line.startswith("aten::addmm ")]
    assert addmm[1] == "-" and addmm[-3] == "-"


def test_microbenchmark_refuses_without_cuda():
    with pytest.raises(BackendUnavailable) as info:
        measure_peaks(sys.executable, timeout_s=120)
    assert "no CUDA device" in info.value.message and "devices.yaml" in info.value.remedy


def test_microbenchmark_measures_this_cpu():
    spec = measure_peaks(sys.executable, timeout_s=120, allow_cpu=True, size=128)
    assert spec.measured and spec.source == MEASURED_SOURCE and spec.name.startswith("cpu")
    # A 128^3 matmul is 4.19 MFLOP: at least 1 MFLOP/s and at most 10 TFLOP/s on any CPU that runs this suite.
    assert 1e6 < spec.peak_flop_per_s["fp32"] < 1e13
    assert 1e6 < spec.dram_bandwidth_bytes_per_s < 1e13
    assert spec.peak_clock_mhz == {} and "below theoretical peaks" in spec.notes[0]


def test_the_outside_operators_warning_judges_the_fastest_window_without_the_profiler():
    """A median another process stretched is no evidence that the workload runs outside its operators; a window
    that is slow even at its fastest is."""
    from mcp_server.assemble.torch_profiler import outside_operators, window_outside_operators
    from mcp_server.schema.profile import WindowTotals

    contended = WindowTotals(wall_time_ns=2_000_000, cpu_operator_time_ns=500_000, unprofiled_windows=5,
                             unprofiled_wall_time_ns=28_000_000, unprofiled_wall_time_range_ns=[700_000, 40_000_000])
    assert window_outside_operators(contended) is None and outside_operators(contended) == []
    pooled = contended.model_copy(update={"unprofiled_wall_time_range_ns": [20_000_000, 40_000_000]})
    assert window_outside_operators(pooled) == (20_000_000, 2.5)
    [said] = outside_operators(pooled)
    assert said.startswith("the window lasted 20.0 ms (the fastest of 5 windows without the profiler; median 28.0 ms)")
