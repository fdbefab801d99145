"""bench: pure-Python statistics, then one real interleaved run of the tiny workloads in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mcp_server.errors import UsageError, WorkloadError
from mcp_server.proof.bench import (
    BENCH_JSON,
    bench,
    bench_file,
    bootstrap_speedup,
    load_bench_result,
    percentile,
    summarize,
    summary_line,
)

WORKLOADS = Path(__file__).resolve().parent / "workloads"
BASELINE = WORKLOADS / "tiny_mlp.py"
OPTIMIZED = WORKLOADS / "tiny_mlp_optimized.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")


def test_percentile_interpolates_between_order_statistics():
    assert percentile([4, 1, 3, 2], 0) == 1
    assert percentile([4, 1, 3, 2], 100) == 4
    assert percentile([4, 1, 3, 2], 50) == pytest.approx(2.5)
    assert percentile([10, 20], 10) == pytest.approx(11.0)


def test_summary_of_samples():
    s = summarize([3, 1, 2, 100])
    assert (s.samples, s.median_ns, s.min_ns, s.max_ns) == (4, 2.5, 1, 100)
    assert s.mean_ns == pytest.approx(26.5)


def test_bootstrap_is_deterministic_and_brackets_the_point_estimate():
    baseline = [100 + (i * 7) % 11 for i in range(60)]
    optimized = [50 + (i * 5) % 9 for i in range(60)]
    first = bootstrap_speedup(baseline, optimized, resamples=500, seed=3)
    again = bootstrap_speedup(baseline, optimized, resamples=500, seed=3)
    assert first == again
    assert first.ci_low <= first.point <= first.ci_high
    assert first.point == pytest.approx(105 / 54, rel=0.05)
    assert first.significant and first.ci_low > 1.5


def test_bootstrap_of_identical_distributions_is_not_significant():
    samples = [100 + (i * 13) % 17 for i in range(40)]
    estimate = bootstrap_speedup(samples, list(reversed(samples)), resamples=500)
    assert estimate.point == pytest.approx(1.0)
    assert not estimate.significant


def test_bad_counts_and_missing_workloads_are_refused(tmp_path):
    with pytest.raises(UsageError):
        bench(BASELINE, OPTIMIZED, reps=0)
    with pytest.raises(UsageError, match="baseline mode"):
        bench(BASELINE, OPTIMIZED, baseline_mode="cudagraphs")
    with pytest.raises(WorkloadError, match="not found"):
        bench(tmp_path / "missing.py", OPTIMIZED)


@pytest.mark.skipif(not SYSTEM_PYTHON.is_file(), reason="needs a second Python interpreter")
def test_an_interpreter_without_torch_is_a_workload_error_with_a_remedy(tmp_path):
    if subprocess.run([str(SYSTEM_PYTHON), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the system python has torch")
    with pytest.raises(WorkloadError) as info:
        bench(BASELINE, OPTIMIZED, python=str(SYSTEM_PYTHON), out_dir=tmp_path)
    assert "cannot import torch" in info.value.message
    assert "--python" in info.value.remedy


@pytest.mark.slow
def test_interleaved_bench_of_the_tiny_workloads(tmp_path):
    result = bench(
        BASELINE, OPTIMIZED, python=sys.executable, warmup=2, reps=5, rounds=4, input_sets=3, out_dir=tmp_path,
        resamples=300,
    )
    expected_timer = {"cpu": "perf_counter", "cuda": "cuda_event"}
    assert result.timer == expected_timer[result.device_type]
    assert result.baseline.how_run == "eager" and result.optimized.how_run == "optimize()"
    # Interleaved: the side that goes first alternates round by round.
    assert result.orders == [["baseline", "optimized"], ["optimized", "baseline"]] * 2
    for side in (result.baseline, result.optimized):
        assert len(side.samples_ns) == 4 and all(len(r) == 5 for r in side.samples_ns)
        assert side.summary.samples == 20
        assert side.summary.median_ns > 0 and side.summary.min_ns > 0
        assert side.first_call_ns > 0 and side.warmup_time_ns >= side.first_call_ns
    s = result.speedup
    assert s.ci_low <= s.point <= s.ci_high
    assert s.point == pytest.approx(result.baseline.summary.median_ns / result.optimized.summary.median_ns)
    assert result.clocks.source in ("nvidia-smi", "unavailable")
    assert result.torch_version and result.python_executable
    assert load_bench_result(tmp_path / BENCH_JSON) == result
    assert (tmp_path / "bench_child.log").is_file()
    assert "speedup" in summary_line(result)


def test_unknown_tier_is_refused():
    with pytest.raises(UsageError, match="precision tier"):
        bench(BASELINE, OPTIMIZED, baseline_mode="free", tier="fp8")


def test_each_baseline_mode_writes_its_own_file():
    assert [bench_file(m) for m in ("eager", "inductor", "free", "reduce-overhead-bf16")] == [
        "bench.json", "bench_vs_compile.json", "bench_vs_free.json", "bench_vs_reduce_overhead_bf16.json"]


@pytest.mark.slow
def test_free_baseline_is_the_fastest_recipe_of_the_tier_and_names_it(tmp_path):
    result = bench(BASELINE, OPTIMIZED, python=sys.executable, warmup=2, reps=3, rounds=2, input_sets=2,
                   out_dir=tmp_path, resamples=200, baseline_mode="free", tier="reduced")
    medians = result.free_recipe_medians_ns
    assert set(medians) == {"inductor", "reduce-overhead", "inductor-bf16", "reduce-overhead-bf16"}
    assert result.baseline_mode == min(medians, key=medians.get) and result.tier == "reduced"
    assert medians[result.baseline_mode] == round(result.baseline.summary.median_ns)
    assert result.baseline.how_run.startswith("torch.compile")
    assert ("bf16 autocast" in result.baseline.how_run) == result.baseline_mode.endswith("-bf16")
    assert load_bench_result(tmp_path / "bench_vs_free.json") == result
    assert any(w.startswith("baseline: the fastest free recipe of the reduced tier") for w in result.warnings)
    if result.device_type == "cpu" and result.baseline_mode.startswith("reduce-overhead"):
        assert any("CUDA graphs only on a GPU" in w for w in result.warnings)
