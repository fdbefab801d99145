"""Bench: is the optimized workload faster, by how much, and how sure are we.

Both workloads run in ONE child process under the workload's interpreter (`children/bench.py`): same
device, same torch, interleaved calls with alternating order per round, inputs rotated among several sets,
CUDA events on a GPU and a host timer on the CPU. This module computes the statistics from the raw per-call
times in pure Python (median per side, percentile-bootstrap confidence interval of the speedup with a fixed
seed), reads the GPU clocks with nvidia-smi before, during and after (never changing them), and writes
bench.json. Every speedup a report states comes from here, not from summed kernel durations.
"""

from __future__ import annotations

import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from mcp_server.errors import ProfileFormatError, UsageError
from mcp_server.process import now_iso
from mcp_server.progress import Progress, quiet
from mcp_server.proof import check_python, check_workload, run_proof_child
from mcp_server.schema.io import read_model, write_model_atomic
from mcp_server.schema.proof import (
    BenchResult,
    BenchSide,
    ClockObservation,
    ClockReading,
    SpeedupEstimate,
    TimingSummary,
)
from mcp_server.schema.types import BASELINE_MODES, FREE_RECIPES

BENCH_JSON = "bench.json"
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261121
CI_LEVEL = 0.95
CLOCK_QUERY = ["--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader,nounits"]
MARKER = "operator_profiler_bench:"


# --------------------------------------------------------------------------- statistics (pure Python)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> TimingSummary:
    """Median, mean, spread and deciles of per-call times."""
    values = [float(v) for v in samples]
    return TimingSummary(
        samples=len(values),
        median_ns=statistics.median(values),
        mean_ns=statistics.fmean(values),
        min_ns=min(values),
        max_ns=max(values),
        stdev_ns=statistics.stdev(values) if len(values) > 1 else 0.0,
        p10_ns=percentile(values, 10),
        p90_ns=percentile(values, 90),
    )


def bootstrap_speedup(
    baseline: Sequence[float],
    optimized: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> SpeedupEstimate:
    """baseline median / optimized median with a percentile-bootstrap interval (deterministic for a seed).

    Each resample draws both sides with replacement, independently, and takes the ratio of their medians.
    """
    if not baseline or not optimized:
        raise ValueError("bootstrap needs samples on both sides")
    rng = random.Random(seed)
    base, opt = list(map(float, baseline)), list(map(float, optimized))
    point = statistics.median(base) / statistics.median(opt)
    ratios = []
    for _ in range(resamples):
        b = statistics.median(rng.choices(base, k=len(base)))
        o = statistics.median(rng.choices(opt, k=len(opt)))
        ratios.append(b / o)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = percentile(ratios, tail), percentile(ratios, 100.0 - tail)
    low, high = min(low, point), max(high, point)
    return SpeedupEstimate(
        point=point, ci_low=low, ci_high=high, ci_level=level, resamples=resamples, bootstrap_seed=seed,
        significant=not (low <= 1.0 <= high),
    )


# --------------------------------------------------------------------------- clocks (observed, never set)


def _parse_clock(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def read_clocks(timeout_s: float = 10.0) -> list[ClockReading] | None:
    """Current SM and memory clocks of every GPU nvidia-smi sees; None when nvidia-smi is absent or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, *CLOCK_QUERY], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    readings = []
    for index, line in enumerate(ln for ln in proc.stdout.splitlines() if ln.strip()):
        fields = [f.strip() for f in line.split(",")]
        readings.append(ClockReading(
            gpu_index=index,
            sm_clock_mhz=_parse_clock(fields[0]) if fields else None,
            memory_clock_mhz=_parse_clock(fields[1]) if len(fields) > 1 else None,
        ))
    return readings


def _clock_note(obs: ClockObservation) -> str | None:
    # `before` is read while the GPU may idle at a low clock; from the first timed round on it should hold still.
    sm = [r.sm_clock_mhz for r in obs.during + obs.after if r.gpu_index == 0 and r.sm_clock_mhz is not None]
    if len(sm) >= 2 and max(sm) - min(sm) > 0.05 * max(sm):
        return f"GPU 0's SM clock moved from {sm[0]:.0f} to {sm[-1]:.0f} MHz while timing (thermal or power limits)"
    return None


# --------------------------------------------------------------------------- the bench


def _side(raw: dict, name: str) -> BenchSide:
    samples = [[int(v) for v in rnd] for rnd in raw["samples_ns"]]
    flat = [v for rnd in samples for v in rnd]
    if not flat:
        raise ProfileFormatError(f"the bench child returned no {name} samples", "pass --reps and --rounds >= 1")
    return BenchSide(
        workload=raw["workload"], how_run=raw["how_run"], first_call_ns=int(raw["first_call_ns"]),
        warmup_time_ns=int(raw["warmup_time_ns"]), summary=summarize(flat), samples_ns=samples,
    )


def bench_file(baseline_mode: str) -> str:
    """The file a bench against `baseline_mode` writes: bench.json against eager, bench_vs_compile.json against
    torch.compile, bench_vs_free.json against the best free recipe, bench_vs_<recipe>.json otherwise."""
    return {"eager": BENCH_JSON, "inductor": "bench_vs_compile.json", "free": "bench_vs_free.json"}.get(
        baseline_mode, f"bench_vs_{baseline_mode.replace('-', '_')}.json")


def bench(
    baseline: Path,
    optimized: Path,
    python: str = sys.executable,
    warmup: int = 5,
    reps: int = 20,
    rounds: int = 6,
    input_sets: int = 4,
    seed: int = 0,
    baseline_mode: str = "eager",
    out_dir: Path | None = None,
    timeout_s: float = 600.0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    tier: str = "exact",
) -> BenchResult:
    """Time `baseline` against `optimized` (two workload files) interleaved in one child process.

    `reps` timed calls per side per round, `rounds` rounds with alternating order, after `warmup` calls per
    side (the first one, compilation included, is reported apart). `baseline_mode` names how the baseline runs:
    'eager'; 'inductor' (the default torch.compile, so the speedup credits only the optimized backend's own
    passes); 'reduce-overhead' (CUDA graphs); either '-bf16' (inside bf16 autocast); or 'free': each free recipe
    of `tier` (FREE_RECIPES) is benched in turn and the one whose baseline is fastest is the result, its
    `baseline_mode` naming it. With `out_dir`, `bench_file(baseline_mode)` and the child's log are written there;
    setting `cancel` stops the child.
    """
    if warmup < 1 or reps < 1 or rounds < 1 or input_sets < 1:
        raise UsageError("--warmup, --reps, --rounds and --input-sets must be >= 1", "pass positive counts")
    if baseline_mode not in BASELINE_MODES:
        raise UsageError(f"unknown baseline mode {baseline_mode!r}", f"choose one of {', '.join(BASELINE_MODES)}")
    if tier not in FREE_RECIPES:
        raise UsageError(f"unknown precision tier {tier!r}", f"choose one of {', '.join(FREE_RECIPES)}")
    base_path, opt_path = check_workload(baseline, "baseline"), check_workload(optimized, "optimized")
    python = check_python(python)
    recipes = FREE_RECIPES[tier] if baseline_mode == "free" else (baseline_mode,)
    results: list[BenchResult] = []
    for recipe in recipes:
        if len(recipes) > 1:
            progress(f"bench: free recipe {recipe} ({len(results) + 1} of {len(recipes)}, tier {tier})")
        results.append(_bench_once(base_path, opt_path, python, warmup, reps, rounds, input_sets, seed, recipe,
                                   out_dir, timeout_s, resamples, progress, cancel))
    result = min(results, key=lambda r: r.baseline.summary.median_ns)
    result.tier = tier if baseline_mode == "free" else None
    if baseline_mode == "free":
        result.free_recipe_medians_ns = {r.baseline_mode: round(r.baseline.summary.median_ns) for r in results}
        medians = ", ".join(f"{r.baseline_mode} {r.baseline.summary.median_ns / 1e3:.1f} us" for r in results)
        result.warnings.append(f"baseline: the fastest free recipe of the {tier} tier, {result.baseline_mode} "
                               f"(baseline medians: {medians})")
    if out_dir is not None:
        write_model_atomic(Path(out_dir) / bench_file(baseline_mode), result)
    return result


def _bench_once(
    base_path: Path, opt_path: Path, python: str, warmup: int, reps: int, rounds: int, input_sets: int, seed: int,
    baseline_mode: str, out_dir: Path | None, timeout_s: float, resamples: int, progress: Progress,
    cancel: threading.Event | None,
) -> BenchResult:
    """One bench child against one baseline recipe: its BenchResult (nothing written but the child's log)."""
    args = [
        "--baseline", str(base_path), "--optimized", str(opt_path), "--warmup", str(warmup), "--reps", str(reps),
        "--rounds", str(rounds), "--input-sets", str(input_sets), "--seed", str(seed),
        "--baseline-mode", baseline_mode,
    ]
    before = read_clocks()
    during: list[ClockReading] = []

    def watch(line: str) -> None:
        if line.startswith(f"{MARKER} round 1/") and before is not None:
            during.extend(read_clocks() or [])
        progress(line)

    started, t0 = now_iso(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="operator_profiler_bench_") as scratch:
        work_dir = Path(out_dir) if out_dir is not None else Path(scratch)
        raw = run_proof_child("bench", args, python, work_dir, "bench", timeout_s, watch, cancel)
    wall = time.monotonic() - t0
    after = read_clocks()
    clocks = ClockObservation(
        source="nvidia-smi" if before is not None else "unavailable",
        before=before or [], during=during, after=after or [],
        note=None if before is not None else "nvidia-smi not found: no clocks observed",
    )
    if clocks.source == "nvidia-smi":
        clocks.note = _clock_note(clocks)
    try:
        base_side, opt_side = _side(raw["sides"]["baseline"], "baseline"), _side(raw["sides"]["optimized"], "optimized")
        env = raw["environment"]
        base_flat = [v for rnd in base_side.samples_ns for v in rnd]
        opt_flat = [v for rnd in opt_side.samples_ns for v in rnd]
        warnings = list(raw.get("warnings", []))
        if min(base_flat + opt_flat) <= 0:
            warnings.append("some calls took 0 ns by the timer: the workload is too small to time per call")
        if clocks.source == "nvidia-smi" and clocks.note:
            warnings.append(clocks.note)
        result = BenchResult(
            baseline=base_side, optimized=opt_side,
            speedup=bootstrap_speedup([max(v, 1) for v in base_flat], [max(v, 1) for v in opt_flat], resamples),
            device_type=raw["device_type"],
            device_name=env.get("device_name") if raw["device_type"] == "cuda" else None,
            timer=raw["timer"], cpu_threads=env.get("cpu_threads"), torch_version=env["torch_version"],
            cuda_version=env.get("cuda_version"),
            python_version=env["python_version"], python_executable=env["python_executable"],
            warmup=warmup, reps=reps, rounds=rounds, input_sets=input_sets, seed=seed, baseline_mode=baseline_mode,
            orders=raw["orders"], clocks=clocks, started_at=started, finished_at=now_iso(), wall_time_s=round(wall, 3),
            warnings=warnings,
        )
    except (KeyError, TypeError, ValidationError) as exc:
        raise ProfileFormatError(
            f"the bench child's result is malformed: {exc}", "report this as a bug with the child's JSON attached"
        ) from exc
    return result


def load_bench_result(path: Path) -> BenchResult:
    """Read a bench.json (e.g. to feed its speedup to validate)."""
    return read_model(Path(path), BenchResult, "bench result",
                      "pass the bench.json an `operator-profiler bench` wrote (or run it again)")


def summary_line(result: BenchResult) -> str:
    """One line for the CLI: medians and the speedup with its interval."""
    s = result.speedup
    verdict = "significant" if s.significant else "not significant (interval contains 1.0)"
    return (
        f"baseline median {result.baseline.summary.median_ns / 1e3:.1f} µs, optimized median "
        f"{result.optimized.summary.median_ns / 1e3:.1f} µs on {result.device_name or result.device_type}: "
        f"speedup {s.point:.3f}× ({s.ci_level:.0%} CI {s.ci_low:.3f}–{s.ci_high:.3f}, {verdict}; "
        f"{result.baseline.summary.samples} calls per side)"
    )
