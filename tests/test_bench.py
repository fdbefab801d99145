"""bench: pure-Python statistics, then real measurements of the tiny workloads, each side in its own processes."""

from __future__ import annotations

import inspect
import json
import lzma
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
from pydantic import ValidationError

from mcp_server.errors import UsageError, WorkloadError
from mcp_server.proof.bench import (
    BENCH_JSON,
    IN_TURNS_CAVEAT,
    _result,
    bench,
    bench_file,
    blocks_of,
    load_bench_result,
    spread_notes,
    summary_line,
)
from mcp_server.proof.measure import Measured
from mcp_server.proof.stats import bootstrap_paired_speedup, bootstrap_speedup, pairable, percentile, summarize
from mcp_server.proof.turns import block_order
from mcp_server.schema.proof import BenchResult
from mcp_server.schema.requests import BenchRequest, Interpreter, TimingOptions

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "tests" / "workloads"
BASELINE = WORKLOADS / "tiny_mlp.py"
OPTIMIZED = WORKLOADS / "tiny_mlp_optimized.py"
SYSTEM_PYTHON = Path("/usr/bin/python3")
FAST = TimingOptions(warmup=2, calls=12, queued=12, blocks=2, budget_s=0.2, input_sets=2)


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
    baseline = [[100 + (i * 7) % 11 for i in range(20)] for _ in range(3)]
    optimized = [[50 + (i * 5) % 9 for i in range(20)] for _ in range(3)]
    first = bootstrap_speedup(baseline, optimized, resamples=500, seed=3)
    assert first == bootstrap_speedup(baseline, optimized, resamples=500, seed=3)
    assert first.ci_low <= first.point <= first.ci_high
    assert first.point == pytest.approx(105 / 54, rel=0.05)
    assert first.significant and first.ci_low > 1.5


def test_bootstrap_of_identical_distributions_is_not_significant():
    samples = [[100 + (i * 13) % 17 for i in range(20)] for _ in range(3)]
    estimate = bootstrap_speedup(samples, [list(reversed(r)) for r in samples], resamples=500)
    assert estimate.point == pytest.approx(1.0)
    assert not estimate.significant


def test_rounds_that_disagree_widen_the_interval():
    """One process of the optimized side ran slow: resampling rounds must show that doubt; pooling the calls hides
    it (the interval of the pooled calls is much narrower)."""
    base = [[100.0 + (i % 3) for i in range(30)] for _ in range(3)]
    opt = [[start + (i % 3) for i in range(30)] for start in (50.0, 51.0, 95.0)]
    by_rounds = bootstrap_speedup(base, opt, resamples=500)
    pooled = bootstrap_speedup([sum(base, [])], [sum(opt, [])], resamples=500)
    assert by_rounds.ci_high - by_rounds.ci_low > 3 * (pooled.ci_high - pooled.ci_low)
    assert by_rounds.ci_low < 1.2 < by_rounds.ci_high


def test_a_host_that_slows_both_sides_at_once_leaves_the_paired_interval_narrow():
    """Timed in turns, block k of each side met the same host: here it ran each block at its own speed, 1x to 2x
    (the H200's host-bound spread), the optimized side always 2x faster than the baseline beside it. Pairing the
    blocks keeps the interval around 2x; resampling the sides apart spreads it over the host's range."""
    speeds = [[1.0, 1.9, 1.3], [1.6, 1.0, 2.0], [1.2, 1.7, 1.1]]  # rounds, then blocks
    base = [[[100.0 * f + i % 3 for i in range(10)] for f in r] for r in speeds]
    opt = [[[50.0 * f + i % 2 for i in range(10)] for f in r] for r in speeds]
    assert pairable(base, opt) and not pairable(base, opt[:2])
    paired = bootstrap_paired_speedup(base, opt, resamples=500)
    apart = bootstrap_speedup([sum(r, []) for r in base], [sum(r, []) for r in opt], resamples=500)
    assert 1.9 < paired.point < 2.1 and 1.9 < apart.point < 2.1
    assert 1.85 < paired.ci_low <= paired.ci_high < 2.15 and paired.method.startswith("paired bootstrap")
    assert apart.ci_high - apart.ci_low > 5 * (paired.ci_high - paired.ci_low)
    assert paired == bootstrap_paired_speedup(base, opt, resamples=500)  # a function of the times


def test_the_paired_speedup_is_the_median_of_the_blocks_ratios_not_of_two_pooled_modes():
    """The host ran one round at 100 µs a call, one at 120, and moved between a third round's blocks; the optimized
    side is 1 % slower than the baseline's block beside it, every time. Half the calls of each side sit in each mode,
    and which mode holds a side's pooled median is decided by a few calls (as recorded: below)."""
    def side(low: float, high: float) -> list[list[list[float]]]:
        return [[[low] * 10] * 3, [[high] * 10] * 3, [[low] * 10, [high if low > 100 else low] * 10, [high] * 10]]
    base, opt = side(100.0, 120.0), side(101.0, 121.2)  # the third round's second block: the host moved between
    pooled = bootstrap_speedup([sum(r, []) for r in base], [sum(r, []) for r in opt], resamples=200)
    paired = bootstrap_paired_speedup(base, opt, resamples=200)
    assert pooled.point == pytest.approx(100 / 121.2)  # 0.825: the two pooled medians in different modes
    assert paired.point == pytest.approx(100 / 101) and paired.ci_low > 0.98


def test_blocks_in_turns_pair_up_and_flip_every_round():
    assert block_order(("baseline", "optimized"), 3, 0) == [
        "baseline", "optimized", "optimized", "baseline", "baseline", "optimized"]
    assert block_order(("baseline", "optimized"), 2, 1) == ["optimized", "baseline", "baseline", "optimized"]


def test_bad_rounds_and_missing_workloads_are_refused(tmp_path):
    with pytest.raises(UsageError, match="at least 3"):
        bench(BASELINE, OPTIMIZED, rounds=2)
    with pytest.raises(WorkloadError, match="not found"):
        bench(tmp_path / "missing.py", OPTIMIZED)
    with pytest.raises(ValidationError, match="at least 3|greater than or equal to 3"):
        BenchRequest(baseline=BASELINE, optimized=OPTIMIZED, python=Interpreter(python=sys.executable),
                     project=tmp_path, rounds=1)


def test_the_baseline_mode_is_eager_free_or_a_recipe_by_its_canonical_name(tmp_path):
    def request(mode: str) -> BenchRequest:
        return BenchRequest(baseline=BASELINE, optimized=OPTIMIZED, python=Interpreter(python=sys.executable),
                            project=tmp_path, baseline_mode=mode)

    assert request("free").baseline_mode == "free"
    assert request("bf16-cast+reduce-overhead").baseline_mode == "reduce-overhead+bf16-cast"
    with pytest.raises(ValidationError, match="unknown recipe part 'inductor'"):
        request("inductor")


def test_each_baseline_mode_writes_its_own_file():
    assert [bench_file(m) for m in ("eager", "free", "reduce-overhead+bf16-cast")] == [
        "bench.json", "bench_vs_free.json", "bench_vs_reduce_overhead_bf16_cast.json"]


@pytest.mark.skipif(not SYSTEM_PYTHON.is_file(), reason="needs a second Python interpreter")
def test_an_interpreter_without_torch_is_a_workload_error_with_a_remedy(tmp_path):
    if subprocess.run([str(SYSTEM_PYTHON), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the system python has torch")
    with pytest.raises(WorkloadError) as info:
        bench(BASELINE, OPTIMIZED, python=str(SYSTEM_PYTHON), out_dir=tmp_path)
    assert "cannot import torch" in info.value.message
    assert "--python" in info.value.remedy
    # the failed child's log is kept (in turns both sides start at once: the one that failed first, or both)
    assert {p.name for p in tmp_path.glob("*.log")} & {"bench_baseline_round1.log", "bench_optimized_round1.log"}


def test_free_without_a_frontier_says_how_to_measure_it(tmp_path):
    with pytest.raises(UsageError) as info:
        bench(BASELINE, OPTIMIZED, baseline_mode="free", recipes=tmp_path / "recipes.json")
    assert "needs the free frontier" in info.value.message and "operator-profiler recipes" in info.value.remedy


@pytest.mark.slow
@pytest.mark.parametrize("interleave", [True, False], ids=["in_turns", "one_at_a_time"])
def test_each_side_runs_in_its_own_processes_rounds_alternating(tmp_path, interleave):
    result = bench(BASELINE, OPTIMIZED, python=sys.executable, options=FAST, rounds=3, out_dir=tmp_path,
                   resamples=300, interleave=interleave)
    assert result.timer == {"cpu": "perf_counter", "cuda": "cuda_event"}[result.device_type]
    assert result.baseline.how_run == "as written (eager)" and result.optimized.how_run == "optimize()"
    b, o = "baseline", "optimized"
    assert result.interleaved is interleave
    assert result.orders == ([[b, o, o, b], [o, b, b, o], [b, o, o, b]] if interleave else [[b, o], [o, b], [b, o]])
    for side in (result.baseline, result.optimized):
        assert [m.round for m in side.rounds] == [0, 1, 2]
        assert all(len(m.latency_ns) >= 10 and len(m.back_to_back_ns) == 2 for m in side.rounds)
        assert side.latency.samples == sum(len(m.latency_ns) for m in side.rounds)
        assert side.latency.median_ns > 0 and side.back_to_back.median_ns > 0 and side.first_call_ns > 0
        for m in side.rounds:  # in turns: two blocks, each its latency calls and one back-to-back value
            assert m.latency_blocks == ([len(m.latency_ns) // 2] * 2 if interleave else [])
            assert [len(block) for block in blocks_of(m, "back_to_back")] == ([1, 1] if interleave else [2])
    for s in (result.latency_speedup, result.back_to_back_speedup):
        assert s.ci_low <= s.point <= s.ci_high
        assert s.method.startswith("paired") is interleave
    assert result.headline == "latency" and result.speedup == result.latency_speedup
    if interleave:  # the median of the paired blocks' ratios
        base = [blocks_of(m, "latency") for m in result.baseline.rounds]
        opt = [blocks_of(m, "latency") for m in result.optimized.rounds]
        expected = median(median(b) / median(o) for rb, ro in zip(base, opt, strict=True)
                          for b, o in zip(rb, ro, strict=True))
    else:  # the ratio of the pooled medians
        expected = result.baseline.latency.median_ns / result.optimized.latency.median_ns
    assert result.latency_speedup.point == pytest.approx(expected)
    assert load_bench_result(tmp_path / BENCH_JSON) == result
    assert sorted(p.name for p in tmp_path.iterdir()) == [BENCH_JSON]  # the children's files stay out of it
    line = summary_line(result)
    assert line.index("latency:") < line.index("back-to-back:") and "3 processes per side" in line


@pytest.mark.slow
def test_a_side_that_fails_in_turns_stops_the_other_and_names_its_log(tmp_path):
    """The optimized workload runs out of memory while the baseline's process waits for its first turn: the error is
    the failing side's, with its log kept and a remedy that names one process at a time, and no process of the
    round is left waiting."""
    baseline = tmp_path / "tiny_mlp.py"
    baseline.write_text(BASELINE.read_text())
    broken = tmp_path / "tiny_mlp_broken.py"
    broken.write_text("from tiny_mlp import get_model_and_input  # noqa: F401\n\n\n"
                      "def optimize(model):\n    raise RuntimeError('CUDA out of memory. Tried to allocate 2 GiB')\n")
    with pytest.raises(WorkloadError) as info:
        bench(baseline, broken, python=sys.executable, options=FAST, out_dir=tmp_path / "out", timeout_s=120,
              interleave=True)
    assert "CUDA out of memory" in info.value.message and "without --interleave" in info.value.remedy
    assert (tmp_path / "out" / "bench_optimized_round1.log").is_file()
    assert subprocess.run(["pgrep", "-f", str(baseline)], capture_output=True).returncode == 1


def _recorded(tmp_path: Path, name: str) -> BenchResult:
    """A bench.json that `benchmarks/floor_in_turns.py` recorded on one H200: mlp_activations' recipe
    reduce-overhead+fp16-cast (CUDA-graphed, host-bound) against the workload `optimize` writes for it."""
    path = tmp_path / f"{name}.json"
    path.write_bytes(lzma.decompress((REPO / "tests" / "fixtures" / f"{name}.json.xz").read_bytes()))
    return load_bench_result(path)


def test_a_bench_recorded_in_turns_on_the_h200_pairs_its_blocks(tmp_path):
    """The recorded blocks, cut by `latency_blocks` and paired: a T5 encoder's recipe against the same recipe as a
    workload (recorded with both processes of a round bound to one CPU, a trial since dropped). One round ran at
    ~960 µs on both sides and two at ~850, the workload 0-7 % slower per block: the ratio of the pooled medians,
    which that bench wrote, read 0.910; the paired blocks' median reads 0.99 within an interval below 1. The
    one-at-a-time bench keeps its unpaired interval."""
    t5, alone = _recorded(tmp_path, "h200_bench_t5_in_turns"), _recorded(tmp_path, "h200_bench_one_at_a_time")
    assert t5.interleaved and not alone.interleaved and t5.device_name == "NVIDIA H200"
    base = [blocks_of(m, "latency") for m in t5.baseline.rounds]
    opt = [blocks_of(m, "latency") for m in t5.optimized.rounds]
    assert [len(r) for r in base] == [len(r) for r in opt] == [3, 3, 3]
    ratios = sorted(median(b) / median(o) for rb, ro in zip(base, opt, strict=True)
                    for b, o in zip(rb, ro, strict=True))
    assert ratios[0] > 0.92 and ratios[-1] < 1.01
    assert round(t5.latency_speedup.point, 3) == 0.910  # the old estimate, as recorded
    paired = bootstrap_paired_speedup(base, opt, t5.latency_speedup.resamples, t5.latency_speedup.bootstrap_seed)
    assert paired.point == ratios[4] and 0.98 < paired.point < 1.0 and paired.ci_low < paired.point < paired.ci_high
    assert alone.back_to_back_speedup.method.startswith("bootstrap of the ratio")


def test_one_process_at_a_time_is_the_default_because_a_side_read_faster_beside_the_other(tmp_path):
    """mlp_activations against its committed optimized workload on one H200, benched in turns and then one process
    at a time (the same clocks, 1980 MHz): the CUDA-graphed float16 side's back-to-back medians were 105.8-106.1 µs
    in every process that timed beside the other side's, 112.9-113.6 µs alone (Timer: 112-113 µs); the GPU-bound
    eager side did not move. So bench runs one process at a time unless asked (`--interleave`)."""
    turns = _recorded(tmp_path, "h200_mlp_optimized_bench_in_turns")
    alone = _recorded(tmp_path, "h200_mlp_optimized_bench_alone")
    assert turns.interleaved and not alone.interleaved

    def medians(result: BenchResult, side: str) -> list[float]:
        return [median(m.back_to_back_ns) / 1e3 for m in getattr(result, side).rounds]
    assert max(medians(turns, "optimized")) < 107 < 112 < min(medians(alone, "optimized"))
    assert max(medians(turns, "baseline") + medians(alone, "baseline")) / min(
        medians(turns, "baseline") + medians(alone, "baseline")) < 1.01
    assert BenchRequest.model_fields["interleave"].default is False
    assert inspect.signature(bench).parameters["interleave"].default is False


def test_a_gpu_bench_in_turns_says_what_turns_did_to_a_side_on_the_h200(tmp_path):
    """The recorded in-turns bench, its processes' results put through bench's own assembly again: in turns on a GPU
    the result carries the caveat; the same results assembled as one process at a time do not."""
    turns = _recorded(tmp_path, "h200_mlp_optimized_bench_in_turns")
    env = {"device_name": turns.device_name, "torch_version": turns.torch_version, "python_version":
           turns.python_version, "python_executable": turns.python_executable, "cpu_threads": turns.cpu_threads}
    facts = {"device_type": "cuda", "timer": turns.timer, "environment": env}
    measured = {side: [Measured({**m.model_dump(), **facts}, m.wall_time_s) for m in getattr(turns, side).rounds]
                for side in ("baseline", "optimized")}
    clocks = turns.clocks.model_copy(update={"note": None})
    options = TimingOptions(blocks=turns.blocks)
    for interleaved in (True, False):
        result = _result(Path(turns.baseline.workload), Path(turns.optimized.workload), measured, turns.orders,
                         options, 3, "eager", "exact", None, None, clocks, turns.started_at, 1.0, 200, interleaved)
        assert (IN_TURNS_CAVEAT in result.warnings) is interleaved
        assert result.method == turns.method if interleaved else result.method != turns.method


def test_a_process_that_slows_alone_in_turns_still_widens_the_interval(tmp_path):
    """Round 2 of the recorded bench: the optimized process's back-to-back blocks ran 125, 155 and 182 µs while the
    baseline's blocks beside them held 115-124 µs; pairing cancels what both processes meet, not this, and bench
    says the side's processes disagreed."""
    turns = _recorded(tmp_path, "h200_bench_in_turns")
    slow = [round(v / 1e3) for v in turns.optimized.rounds[1].back_to_back_ns]
    beside = [round(v / 1e3) for v in turns.baseline.rounds[1].back_to_back_ns]
    assert slow == [125, 155, 182] and max(beside) <= 125
    base = [blocks_of(m, "back_to_back") for m in turns.baseline.rounds]
    opt = [blocks_of(m, "back_to_back") for m in turns.optimized.rounds]
    paired = bootstrap_paired_speedup(base, opt)
    assert paired.ci_low < 0.85 < 0.97 < paired.ci_high
    assert any(n.startswith("the optimized side's latency medians ranged") for n in spread_notes("optimized",
                                                                                               turns.optimized))


def test_processes_that_disagree_are_said_with_their_range():
    """sdpa_attention's bench against eager on the H100 (10 processes a side): its float16 side, whose call alone
    waits on the host, measured 1.29x apart between processes by latency and within 15 % back to back; the
    GPU-bound fp32 eager side within 15 % by both."""
    result = load_bench_result(REPO / "examples" / "sdpa_attention" / "bench.json")
    optimized, baseline = spread_notes("optimized", result.optimized), spread_notes("baseline", result.baseline)
    assert baseline == [] and len(optimized) == 1
    assert optimized[0].startswith("the optimized side's latency medians ranged ") and "(1.29×)" in optimized[0]
    assert "more --rounds narrow it" in optimized[0]


@pytest.mark.slow
def test_free_runs_the_tiers_winner_from_recipes_json(tmp_path):
    """A frontier measured by `recipes` (two recipes beside the reference): `free` runs the winner of the tier, and
    says so when that frontier was stopped early."""
    from mcp_server.proof.recipes import recipes

    report = recipes(BASELINE, python=sys.executable, options=FAST, seeds=(0,), only=("eager+bf16-autocast",),
                     out_dir=tmp_path)
    winner = report.winner("reduced")
    assert winner is not None
    stopped = report.model_copy(update={"stopped": "SIGTERM after 1 recipe(s)"})  # as a stopped run writes it
    (tmp_path / "recipes.json").write_text(stopped.model_dump_json())
    result = bench(BASELINE, OPTIMIZED, python=sys.executable, options=FAST, baseline_mode="free", tier="reduced",
                   recipes=tmp_path / "recipes.json", out_dir=tmp_path, resamples=200)
    assert result.baseline.recipe == winner.recipe and result.baseline.how_run == winner.recipe
    assert any("was stopped early (SIGTERM after 1 recipe(s))" in w for w in result.warnings)
    assert result.tier == "reduced" and result.recipes_path == str(tmp_path / "recipes.json")
    assert load_bench_result(tmp_path / "bench_vs_free.json") == result
    moved = json.loads((tmp_path / "recipes.json").read_text())
    moved["workload"] = "/elsewhere/other.py"
    (tmp_path / "other.json").write_text(json.dumps(moved))
    with pytest.raises(UsageError, match="frontier of /elsewhere/other.py"):
        bench(BASELINE, OPTIMIZED, baseline_mode="free", recipes=tmp_path / "other.json")
