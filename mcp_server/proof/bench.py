"""Bench: is the optimized workload faster, by how much, and how sure are we.

Each side runs in its own fresh processes (`proof/measure.py`), never two timed at once. By default round r runs the
baseline then the optimized workload when r is even, the other way round when r is odd, one process at a time. With
`interleave`, a round starts one process of each side; they build and compile side by side, then time their blocks
in turns, A B B A …, the first side flipped every round (`proof/turns.py`): each block sits next to one of the other
side, which met the same host, and the interval pairs them. That narrows the interval where the host's speed moves,
but it is not the default: with the other side's process alive on the GPU, mlp_activations' CUDA-graphed float16
side read 105.8-106.1 µs back to back, 112.9-113.6 µs one process at a time (per-process medians;
`torch.utils.benchmark.Timer`, 112-113 µs), on one H200, clocks the same (`docs/measurements/`). Nothing compiled,
captured or allocated is shared between the sides (two workloads compiled, CUDA-graphed and interleaved call by call
in one process share Dynamo's caches, CUDA graph trees, the allocator and the host: the number measured there is
that process's, not either workload's). Every process reports both metrics: latency (each call alone, synchronised)
and back-to-back time per call; the speedup of each has a bootstrap interval over rounds, blocks and calls
(`proof/stats.py`), and `headline` says which one reports state. GPU clocks are read with nvidia-smi before, once
timing has started, and after; never changed. bench.json is written atomically. Every speedup a report states comes
from here, not from summed kernel durations.
"""

from __future__ import annotations

import functools
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mcp_server.errors import UsageError
from mcp_server.process import now_iso
from mcp_server.progress import Progress, quiet
from mcp_server.proof import check_python, check_workload
from mcp_server.proof.measure import TIMING_STARTS, Measured, Way, measure
from mcp_server.proof.recipes import RECIPES_JSON
from mcp_server.proof.stats import (
    BOOTSTRAP_RESAMPLES,
    PROCESS_SPREAD,
    bootstrap_paired_speedup,
    bootstrap_speedup,
    pairable,
    summarize,
)
from mcp_server.proof.turns import measure_in_turns
from mcp_server.schema.io import read_model, write_model_atomic
from mcp_server.schema.proof import (
    BenchResult,
    BenchSide,
    ClockObservation,
    ClockReading,
    Measurement,
    SpeedupEstimate,
)
from mcp_server.schema.recipes import RecipesReport
from mcp_server.schema.requests import TimingOptions

BENCH_JSON = "bench.json"
CLOCK_QUERY = ["--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader,nounits"]
METHOD = ("each side in its own fresh processes, one at a time; rounds alternate the two sides, the order flipped "
          "every round")
INTERLEAVED = ("each side in its own fresh processes; a round starts one of each, which build and compile side by "
               "side, then time their blocks in turns (A B B A …, never two at once), the first side flipped every "
               "round")
SIDES = ("baseline", "optimized")


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
    # `before` is read while the GPU may idle at a low clock; from the first timed window on it should hold still.
    sm = [r.sm_clock_mhz for r in obs.during + obs.after if r.gpu_index == 0 and r.sm_clock_mhz is not None]
    if len(sm) >= 2 and max(sm) - min(sm) > 0.05 * max(sm):
        return f"GPU 0's SM clock moved from {sm[0]:.0f} to {sm[-1]:.0f} MHz while timing (thermal or power limits)"
    return None


# --------------------------------------------------------------------------- the baseline


def bench_file(baseline_mode: str) -> str:
    """The file a bench against `baseline_mode` writes: bench.json against eager (as written), bench_vs_free.json
    against the winner of a tier, bench_vs_<recipe>.json against a named recipe."""
    if baseline_mode == "eager":
        return BENCH_JSON
    return f"bench_vs_{baseline_mode.replace('-', '_').replace('+', '_')}.json"


def load_recipes(path: Path) -> RecipesReport:
    """Read a recipes.json."""
    return read_model(Path(path), RecipesReport, "recipes.json",
                      "pass the recipes.json `operator-profiler recipes` wrote (or run it again)")


def check_frontier_of(report: RecipesReport, path: Path, workload: Path) -> RecipesReport:
    """`report`, the recipes.json at `path`, when it is the frontier of `workload` (by file name: a copy of the
    folder still matches); UsageError otherwise."""
    if Path(report.workload).name != workload.name:
        raise UsageError(f"{path} is the frontier of {report.workload}, not of {workload}",
                         f"run `operator-profiler recipes {workload}` and pass its recipes.json")
    return report


def _free_recipe(recipes: Path | None, baseline: Path, tier: str,
                 options: TimingOptions) -> tuple[str, Path, RecipesReport]:
    """The recipe `free` runs: the winner of `tier` by the headline metric in recipes.json, that file and its
    content."""
    path = recipes if recipes is not None else baseline.parent / RECIPES_JSON
    if not path.is_file():
        raise UsageError(
            f"--baseline-mode free needs the free frontier: no {path}",
            f"run `operator-profiler recipes {baseline}` on this GPU first and pass its recipes.json with --recipes",
        )
    report = check_frontier_of(load_recipes(path), path, baseline)
    winner = report.winner(tier, options.headline)
    if winner is None:
        raise UsageError(f"no recipe of {path} validated in the {tier} tier",
                         "pick another tier, or a recipe by name with --baseline-mode")
    return winner.recipe, path, report


# --------------------------------------------------------------------------- the bench


def bench(
    baseline: Path,
    optimized: Path,
    python: str = sys.executable,
    options: TimingOptions | None = None,
    rounds: int = 3,
    baseline_mode: str = "eager",
    tier: str = "exact",
    recipes: Path | None = None,
    out_dir: Path | None = None,
    timeout_s: float = 600.0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    interleave: bool = False,
) -> BenchResult:
    """Time `baseline` (run as `baseline_mode`) against `optimized`, each side in `rounds` fresh processes.

    `baseline_mode`: 'eager' (the workload as written), 'free' (the winner of `tier` in `recipes`, by default the
    recipes.json beside the baseline) or a recipe's name. `interleave`: each round's two processes run at once and
    time their `options.blocks` blocks in turns (`proof/turns.py`); otherwise (the default) one process at a time,
    each timing its window in one piece. With `out_dir`,
    bench_file(baseline_mode) and the children's log of a child that failed are written there; setting `cancel`
    stops the running children.
    """
    options = options or TimingOptions()
    if rounds < 3:
        raise UsageError(f"--rounds {rounds}: at least 3 rounds per side", "pass --rounds 3 or more")
    base_path, opt_path = check_workload(baseline, "baseline"), check_workload(optimized, "optimized")
    python = check_python(python)
    recipe, recipes_path, frontier = None, None, None
    if baseline_mode == "free":
        recipe, recipes_path, frontier = _free_recipe(recipes, base_path, tier, options)
        progress(f"bench: the baseline is the {tier} tier's winner by {options.headline}, {recipe} ({recipes_path})")
    elif baseline_mode != "eager":
        recipe = baseline_mode
    ways = {"baseline": Way(recipe=recipe), "optimized": Way(optimized=opt_path)}
    before, during = read_clocks(), list[ClockReading]()
    started, t0 = now_iso(), time.monotonic()
    measured: dict[str, list[Measured]] = {name: [] for name in SIDES}
    orders: list[list[str]] = []

    def watch(line: str) -> None:
        if line.startswith(TIMING_STARTS) and before is not None and not during:
            during.extend(read_clocks() or [])
        progress(line)

    def one(side: str, r: int, scratch: Path, turns: Path | None = None, watching: Progress = watch,
            stop: threading.Event | None = cancel) -> Measured:
        return measure(base_path, ways[side], python, options, scratch, f"bench_{side}_round{r + 1}", timeout_s,
                       watching, stop, keep_failed_log=out_dir, turns=turns)

    def clocks_now() -> None:
        if before is not None and not during:
            during.extend(read_clocks() or [])

    with tempfile.TemporaryDirectory(prefix="operator_profiler_bench_") as scratch:
        for r in range(rounds):
            if interleave:
                progress(f"bench: round {r + 1}/{rounds}, both sides in fresh processes, timing {options.blocks} "
                         "block(s) each in turns")
                got, order = measure_in_turns(
                    {side: functools.partial(one, side, r, Path(scratch)) for side in SIDES},
                    Path(scratch), options.blocks, r, progress, cancel, clocks_now if r == 0 else None)
                for side in SIDES:
                    measured[side].append(got[side])
            else:
                order = list(SIDES) if r % 2 == 0 else list(SIDES[::-1])
                for side in order:
                    progress(f"bench: round {r + 1}/{rounds}, {side} in a fresh process")
                    measured[side].append(one(side, r, Path(scratch)))
            orders.append(order)
            if r == 0 and frontier is not None and recipes_path is not None:
                _same_device(frontier, measured["baseline"][0], recipes_path)
    after = read_clocks()
    clocks = ClockObservation(source="nvidia-smi" if before is not None else "unavailable", before=before or [],
                              during=during, after=after or [],
                              note=None if before is not None else "nvidia-smi not found: no clocks observed")
    if clocks.source == "nvidia-smi":
        clocks.note = _clock_note(clocks)
    result = _result(base_path, opt_path, measured, orders, options, rounds, baseline_mode, tier, recipe,
                     recipes_path, clocks, started, time.monotonic() - t0, resamples, interleave)
    if frontier is not None and frontier.stopped:
        result.warnings.append(f"the frontier in {recipes_path} was stopped early ({frontier.stopped}): its winner is "
                               "the best of the recipes measured until then, not necessarily of every free recipe")
    if out_dir is not None:
        write_model_atomic(Path(out_dir) / bench_file(baseline_mode), result)
    return result


def _same_device(report: RecipesReport, first: Measured, path: Path) -> None:
    """The frontier must have been measured on the GPU the bench runs on."""
    env = first.raw.get("environment", {})
    here = env.get("device_name") if first.raw.get("device_type") == "cuda" else "cpu"
    there = report.device_name if report.device_type == "cuda" else "cpu"
    if here != there:
        raise UsageError(f"{path} was measured on {there}; this bench runs on {here}",
                         "run `operator-profiler recipes` on this machine and pass its recipes.json")


def _side(workload: Path, runs: list[Measured], recipe: str | None) -> BenchSide:
    rounds = [m.measurement(i) for i, m in enumerate(runs)]
    return BenchSide(
        workload=str(workload), how_run=rounds[0].how_run, recipe=recipe,
        first_call_ns=int(statistics.median(m.first_call_ns for m in rounds)),
        latency=summarize([v for m in rounds for v in m.latency_ns]),
        back_to_back=summarize([v for m in rounds for v in m.back_to_back_ns]),
        rounds=rounds,
    )


def blocks_of(m: Measurement, metric: str) -> list[list[float]]:
    """One process's samples of `metric` by timed block: its latency calls cut by `latency_blocks`, one
    back-to-back value per block (a process that timed in one piece: a single block)."""
    if metric == "back_to_back":
        return [[v] for v in m.back_to_back_ns] if m.latency_blocks else [list(m.back_to_back_ns)]
    if not m.latency_blocks:
        return [[float(v) for v in m.latency_ns]]
    cuts, at = [], 0
    for count in m.latency_blocks:
        cuts.append([float(v) for v in m.latency_ns[at:at + count]])
        at += count
    return cuts


IN_TURNS_CAVEAT = (
    "timed in turns (--interleave): each side's process was alive on the GPU while the other timed, and on one H200 "
    "a CUDA-graphed float16 side read 6-7 % faster back to back than alone (docs/measurements/); bench without "
    "--interleave for each side's own time")


def spread_notes(name: str, side: BenchSide) -> list[str]:
    """What the side's processes disagree on: a metric whose per-process medians span more than PROCESS_SPREAD.

    A host-bound call (Python, guards, CUDA-graph bookkeeping) runs as fast as the host's CPU does at that moment,
    and on a shared machine that moves by up to 2x between processes and within one over seconds: its median is
    one draw per process, and the interval over rounds says how far that reaches."""
    notes = []
    for metric in ("latency", "back_to_back"):
        medians = [statistics.median(m.latency_ns if metric == "latency" else m.back_to_back_ns) for m in side.rounds]
        low, high = min(medians), max(medians)
        if low > 0 and high / low > PROCESS_SPREAD:
            notes.append(f"the {name} side's {metric.replace('_', '-')} medians ranged {low / 1e3:.1f}–"
                         f"{high / 1e3:.1f} µs between its processes ({high / low:.2f}×): a host-bound call moves "
                         "with the host's speed; its interval is wide for that reason, and more --rounds narrow it")
    return notes


def _result(
    base_path: Path, opt_path: Path, measured: dict[str, list[Measured]], orders: list[list[str]],
    options: TimingOptions, rounds: int, baseline_mode: str, tier: str, recipe: str | None,
    recipes_path: Path | None, clocks: ClockObservation, started: str, wall: float, resamples: int,
    interleaved: bool,
) -> BenchResult:
    base, opt = _side(base_path, measured["baseline"], recipe), _side(opt_path, measured["optimized"], None)
    first = measured["baseline"][0].raw
    env = first.get("environment", {})
    warnings = list(dict.fromkeys(w for runs in measured.values() for m in runs for w in m.raw.get("warnings", [])))
    if clocks.note:
        warnings.append(clocks.note)
    warnings += [note for name, side in (("baseline", base), ("optimized", opt)) for note in spread_notes(name, side)]
    if min(base.latency.min_ns, opt.latency.min_ns) <= 0:
        warnings.append("some calls took 0 ns by the timer: the workload is too small to time per call")
    if interleaved and first["device_type"] == "cuda":
        warnings.append(IN_TURNS_CAVEAT)

    def speedup(metric: str) -> SpeedupEstimate:
        paired = [blocks_of(m, metric) for m in base.rounds], [blocks_of(m, metric) for m in opt.rounds]
        if interleaved and pairable(*paired):
            return bootstrap_paired_speedup(*paired, resamples)
        pick = (lambda m: m.latency_ns) if metric == "latency" else (lambda m: m.back_to_back_ns)
        return bootstrap_speedup([pick(m) for m in base.rounds], [pick(m) for m in opt.rounds], resamples)

    return BenchResult(
        method=INTERLEAVED if interleaved else METHOD, interleaved=interleaved, baseline=base, optimized=opt,
        headline=options.headline,
        latency_speedup=speedup("latency"), back_to_back_speedup=speedup("back_to_back"),
        device_type=first["device_type"],
        device_name=env.get("device_name") if first["device_type"] == "cuda" else None,
        timer=first["timer"], cpu_threads=env.get("cpu_threads"), torch_version=env["torch_version"],
        cuda_version=env.get("cuda_version"), python_version=env["python_version"],
        python_executable=env["python_executable"], rounds=rounds, warmup=options.warmup, calls=options.calls,
        queued=options.queued, blocks=options.blocks, budget_s=options.budget_s, input_sets=options.input_sets,
        seed=options.seed, baseline_mode=baseline_mode, tier=tier if baseline_mode == "free" else None,
        recipes_path=str(recipes_path) if recipes_path is not None else None, orders=orders, clocks=clocks,
        started_at=started, finished_at=now_iso(), wall_time_s=round(wall, 3), warnings=warnings,
    )


def load_bench_result(path: Path) -> BenchResult:
    """Read a bench.json (e.g. to feed its speedup to validate)."""
    return read_model(Path(path), BenchResult, "bench result",
                      "pass the bench.json an `operator-profiler bench` wrote (or run it again)")


def summary_line(result: BenchResult) -> str:
    """One line for the CLI: both metrics' medians and speedups, the headline first."""
    parts = []
    for metric in (result.headline, "back_to_back" if result.headline == "latency" else "latency"):
        s = result.latency_speedup if metric == "latency" else result.back_to_back_speedup
        verdict = "significant" if s.significant else "not significant: the interval contains 1.0"
        b, o = result.baseline.summary_of(metric), result.optimized.summary_of(metric)
        parts.append(f"{metric.replace('_', '-')}: baseline {b.median_ns / 1e3:.1f} µs, optimized "
                     f"{o.median_ns / 1e3:.1f} µs, speedup {s.point:.3f}× ({s.ci_level:.0%} CI "
                     f"{s.ci_low:.3f}–{s.ci_high:.3f}, {verdict})")
    base = result.baseline.recipe or "as written"
    return (f"baseline {base} vs optimized on {result.device_name or result.device_type}, {result.rounds} processes "
            f"per side; " + "; ".join(parts))
