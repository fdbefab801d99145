"""Recipes: the free frontier of a workload, measured for the user (recipes.json).

Each recipe runs in its own fresh process (`proof/measure.py`) under the workload's interpreter: several compile
at a time, and their timed windows take turns on the GPU (`children/gpu_lock.GpuTurns`), as `run`'s passes do.
fp32 eager runs first, alone: it is the reference, and it says which recipes apply (`proof/recipe_plan.py`). Each
recipe is validated against fp32 eager with TF32 off over several seeds and sorted into the tightest tier its error
meets; a recipe that crashes, hangs, does not apply or fails validation is recorded with its reason, never fatal.

One process per recipe cannot tell apart two recipes closer than the processes of one recipe differ (a host-bound
call on a host whose speed changes between processes: `proof.stats.PROCESS_SPREAD`). The runoff then runs each
tier's winner and the recipes within that spread of it again, a few more processes each in alternating order, and
times each by the median of its processes' medians.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mcp_server.children.contract import REFERENCE_RECIPE, recipe_parts, written_floor
from mcp_server.errors import CancelledCapture, ChildTimedOut, WorkloadError
from mcp_server.process import now_iso
from mcp_server.process.child import Terminated
from mcp_server.progress import Progress, quiet
from mcp_server.proof import check_python, check_workload
from mcp_server.proof.measure import Measured, Way, measure
from mcp_server.proof.recipe_plan import plan_first, plan_layout, recipe_code, skipped, stage_winners
from mcp_server.proof.stats import PROCESS_SPREAD, summarize
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.proof import Metric
from mcp_server.schema.recipes import (
    TIER_RTOL,
    ModelFacts,
    ProcessTimes,
    RecipeError,
    RecipeResult,
    RecipesReport,
    Winner,
)
from mcp_server.schema.requests import TimingOptions
from mcp_server.schema.types import TIERS, tiers_within

RECIPES_JSON = "recipes.json"
FAILED_LOGS = "recipe_logs"
LOCK_NAME = "gpu.lock"
METRICS: tuple[Metric, ...] = ("latency", "back_to_back")
RUNOFF_MAX = 3  # recipes of one tier in its runoff, its winner included


def default_jobs(device: str, cpus: int | None = None) -> int:
    """Recipe processes at a time: one on the CPU (a compile beside a timed CPU window would disturb it); on a GPU
    one per four CPUs beyond two, at most four."""
    if device != "cuda":
        return 1
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(1, min(4, (cpus - 2) // 4))


def recipes(
    workload: Path,
    python: str = sys.executable,
    options: TimingOptions | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    thorough: bool = False,
    only: tuple[str, ...] = (),
    jobs: int | None = None,
    out_dir: Path | None = None,
    timeout_s: float = 600.0,
    progress: Progress = quiet,
    cancel: threading.Event | None = None,
    runoff: int = 0,
    runoff_tiers: tuple[str, ...] = TIERS,
) -> RecipesReport:
    """Measure the free frontier of `workload` into `out_dir` (recipes.json; the log of each recipe that failed under
    recipe_logs/). `timeout_s` bounds each recipe's process; `runoff`: more processes for each recipe one process
    cannot tell from the winner of its tier, of `runoff_tiers` (0: none; `optimize` runs `RUNOFF_ROUNDS` for its
    tier)."""
    options = options or TimingOptions()
    path, python = check_workload(workload), check_python(python)
    out = Path(out_dir) if out_dir is not None else Path.cwd()
    started, t0 = now_iso(), time.monotonic()
    runner = _Runner(path, python, options, seeds, out, timeout_s, progress, cancel)
    raw: dict[str, Any] | None = None
    try:
        progress(f"recipes: {REFERENCE_RECIPE}, the reference, alone first")
        reference, raw = runner.run(REFERENCE_RECIPE, "reference")
        if reference.status != "ok" or raw is None:
            raise WorkloadError(f"the workload fails in fp32 eager, the reference: {reference.reason}",
                                f"fix the workload; its log is in {out / FAILED_LOGS}")
        facts = ModelFacts.model_validate(raw["model"])
        runner.written = recipe_error(raw["written_error"]) if raw.get("written_error") else None
        gpu = raw["device_type"] == "cuda"
        jobs = jobs or default_jobs(raw["device_type"])
        runner.finished.append(reference)
        first = plan_first(gpu, facts, thorough, only)
        runner.pool(first, jobs, len(first))
        ran = {r.recipe for r in runner.finished}
        layout = plan_layout(gpu, facts, stage_winners(runner.finished, options.headline), thorough, ran)
        if layout:
            progress(f"recipes: the channels-last layout and cuDNN's autotuner on the winners ({len(layout)} "
                     "recipes)")
            runner.pool(layout, jobs, len(layout))
        runner.race(runoff_tiers, runoff, jobs, options.headline)
    except (KeyboardInterrupt, Terminated, CancelledCapture) as exc:  # stopped: what was measured is kept, marked
        if raw is not None and runner.stopped is not None:
            report = _report(path, raw, runner.written, runner.finished, options, seeds, thorough, only, jobs or 1,
                             started, t0, stopped=f"{runner.stopped} after {len(runner.finished) - 1} recipe(s)",
                             raced=runner.raced, rounds=runoff)
            write_model_atomic(out / RECIPES_JSON, report)
            progress(f"recipes: stopped; wrote the {len(runner.finished) - 1} recipe(s) measured to "
                     f"{out / RECIPES_JSON} ({type(exc).__name__})")
        raise
    finally:
        runner.close()
    report = _report(path, raw, runner.written, runner.finished, options, seeds, thorough, only, jobs or 1, started,
                     t0, raced=runner.raced, rounds=runoff)
    write_model_atomic(out / RECIPES_JSON, report)
    return report


def _report(path: Path, raw: dict[str, Any], written: RecipeError | None, results: list[RecipeResult],
            options: TimingOptions, seeds: tuple[int, ...], thorough: bool, only: tuple[str, ...], jobs: int,
            started: str, t0: float, stopped: str | None = None, raced: tuple[str, ...] = (),
            rounds: int = 0) -> RecipesReport:
    """recipes.json's content from the reference's child JSON, its error against itself in float32 (`written`) and
    the results (the reference first); `stopped`: why the run ended before the rest ran (said in the first warning
    too); `raced`: the tiers whose races the runoff ran, `rounds` more processes each."""
    env, facts = raw["environment"], ModelFacts.model_validate(raw["model"])
    gpu = raw["device_type"] == "cuda"
    stopped_warning = [f"the run was stopped ({stopped}): this frontier holds only the recipes measured until then, "
                       "and its winners are theirs"] if stopped else []
    return RecipesReport(
        workload=str(path), device_type=raw["device_type"], device_name=env.get("device_name") if gpu else None,
        torch_version=env["torch_version"], cuda_version=env.get("cuda_version"),
        python_executable=env["python_executable"], model=facts, written_error=written,
        seeds=list(seeds), thorough=thorough, jobs=jobs,
        results=_ranked(results, options.headline), winners=_winners(results, results[0]),
        pareto=_pareto(results), skipped=skipped(gpu, facts, thorough, only, {r.recipe for r in results}, stopped),
        started_at=started, finished_at=now_iso(), wall_time_s=round(time.monotonic() - t0, 3),
        warnings=[*stopped_warning, *unstable_reference(results, facts), *tail_warning(results),
                  *_written_warning(raw), *dict.fromkeys(w for r in results for w in r.warnings)],
        stopped=stopped, runoff_rounds=rounds if raced else 0,
        runoff_tiers=list(raced), runoff_changed=_changed(results, options.headline, raced),
    )


def contenders(results: list[RecipeResult], metric: Metric, tiers: tuple[str, ...] = TIERS) -> list[str]:
    """Recipes one process each cannot rank: for each of `tiers` whose winner by `metric` has recipes valid in the
    tier within `PROCESS_SPREAD` of its time, the winner and those (fastest first, `RUNOFF_MAX` of them at most)."""
    named: dict[str, None] = {}
    for tier in tiers:
        valid = sorted((r for r in results if r.status == "ok" and r.tier in tiers_within(tier)
                        and r.time_ns(metric) is not None), key=lambda r: r.time_ns(metric) or 0.0)
        close = [r for r in valid if (r.time_ns(metric) or 0.0) <= (valid[0].time_ns(metric) or 0.0) * PROCESS_SPREAD
                 ] if valid else []
        if len(close) > 1:
            named.update(dict.fromkeys(r.recipe for r in close[:RUNOFF_MAX]))
    return list(named)


def _changed(results: list[RecipeResult], metric: Metric, raced: tuple[str, ...]) -> list[str]:
    """The winners of the `raced` tiers the runoff changed: `tier (metric): first-process winner -> winner` (another
    tier's winner may change too, a recipe it shares with a raced tier measured again: that is no race of its own)."""
    first = [r.model_copy(update={"runoff": []}) for r in results]
    before = {(w.tier, w.metric): w.recipe for w in _winners(first, first[0])}
    return [f"{w.tier} ({w.metric.replace('_', '-')}): {before[(w.tier, w.metric)]} -> {w.recipe}"
            for w in _winners(results, results[0]) if w.metric == metric and w.tier in raced
            and before.get((w.tier, w.metric), w.recipe) != w.recipe] if results else []


def _written_warning(raw: dict[str, Any]) -> list[str]:
    """One warning when the model is written in bfloat16/float16 but would not run in float32: the tiers then keep
    fp32's tolerances, which two implementations of a half-precision model may not meet."""
    failed = (raw.get("written_error") or {}).get("failed")
    return [f"the model is written in bfloat16/float16 but did not run in float32 ({failed}): every tier keeps its "
            "own tolerance, which recipes computing the same half-precision model differently may exceed"
            ] if failed else []


def unstable_reference(results: list[RecipeResult], facts: ModelFacts | None) -> list[str]:
    """One warning when the reference fails against itself: fp32 eager's output, called again on the same inputs,
    differs, so no recipe can validate in any tier; the cause when the model shows one (dropout in training mode)."""
    reference = next((r for r in results if r.recipe == REFERENCE_RECIPE), None)
    if reference is None or reference.status != "ok" or reference.tier is not None or reference.error is None:
        return []
    worst = reference.error.max_rel_error
    dropout = facts.dropout_in_training if facts is not None else []
    cause = (f"its model is in training mode with dropout active ({', '.join(dropout)}): return "
             "model.eval() from get_model_and_input()" if dropout else
             "something in its forward is random or unseeded (sampling, dropout by hand, an uninitialised buffer): "
             "make it deterministic for the same seed")
    return [f"{REFERENCE_RECIPE}, the reference, does not reproduce its own output (largest relative error "
            f"{worst:.2g} against another run of itself on the same inputs), so no recipe validates in any tier: "
            + cause]


def tail_warning(results: list[RecipeResult]) -> list[str]:
    """One warning when recipes failed every tier through a few elements only: their 99th percentile of relative
    error within the reduced tier's tolerance, their largest error beyond every tier's. A discrete choice in the
    model (top-k routing, an argmax, a threshold) then flips at lower precision on a few rows; the tiers compare
    every element, so no reduced recipe can hold them."""
    flipped = [r for r in results if r.status == "ok" and r.tier is None and r.error is not None
               and r.error.max_rel_error is not None and r.error.max_rel_error > TIER_RTOL[TIERS[-1]]
               and (r.error.rel_error_percentiles or {}).get("p99", 1.0) <= TIER_RTOL["reduced"]]
    if not flipped:
        return []
    p99 = max((r.error.rel_error_percentiles or {})["p99"] for r in flipped if r.error)
    worst = max(r.error.max_rel_error or 0.0 for r in flipped if r.error)
    return [f"{len(flipped)} recipe(s) failed every tier in a few elements only (99 % of elements within "
            f"{p99:.1e}, the worst {worst:.2g}): a discrete choice in the model (top-k routing, an argmax, a "
            "threshold) flips at lower precision, and the tiers compare every element"]


class _Runner:
    """Runs recipes, each in its own measurement child, and turns their JSON into results."""

    def __init__(self, path: Path, python: str, options: TimingOptions, seeds: tuple[int, ...], out: Path,
                 timeout_s: float, progress: Progress, cancel: threading.Event | None) -> None:
        self.path, self.python, self.options, self.seeds = path, python, options, seeds
        self.scratch = Path(tempfile.mkdtemp(prefix="operator_profiler_recipes_"))
        self.failed_logs, self.lock = out / FAILED_LOGS, self.scratch / LOCK_NAME
        shutil.rmtree(self.failed_logs, ignore_errors=True)  # a previous frontier's logs would read as this one's
        self.timeout_s, self.progress, self.cancel = timeout_s, progress, cancel
        self.done = 0
        self.finished: list[RecipeResult] = []  # every result so far, in the order they ended
        self.stopped: str | None = None  # why the run is stopping: results ending after it are not kept
        self.written: RecipeError | None = None  # a model written below fp32: the reference against itself in fp32
        self.raced: tuple[str, ...] = ()  # the tiers whose races the runoff ran

    def pool(self, planned: list[tuple[str, str]], jobs: int, total: int) -> None:
        """Run `planned` (recipe, stage) with `jobs` processes at a time, in order; each result joins `finished`."""
        self.done = 0
        executor = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="recipe")
        try:
            for _ in executor.map(lambda item: self._counted(item, total), planned):
                pass
        except BaseException as exc:
            self.stopped = str(exc) or type(exc).__name__  # the children still running are stopped, not measured
            raise
        finally:
            executor.shutdown(wait=True, cancel_futures=True)

    def _counted(self, item: tuple[str, str], total: int) -> None:
        result, _ = self.run(*item)
        if self.stopped is not None or (self.cancel is not None and self.cancel.is_set()):
            return
        self.finished.append(result)
        self.done += 1
        self.progress(f"recipes: [{self.done}/{total}] {_line(result)}")

    def race(self, tiers: tuple[str, ...], rounds: int, jobs: int, metric: Metric) -> None:
        """The runoff of `tiers`: their contenders run `rounds` more times each; a recipe the new times bring within
        the spread of a winner (a winner measured slower in its other processes) runs too, once more at most."""
        if rounds < 1:
            return
        ran: set[str] = set()
        for _ in range(2):
            names = [n for n in contenders(self.finished, metric, tiers) if n not in ran]
            if not names:
                break
            self.runoff(names, rounds, jobs, metric)
            ran.update(names)
            self.raced = tiers

    def runoff(self, names: list[str], rounds: int, jobs: int, metric: Metric) -> None:
        """Run each of `names` `rounds` more times, each time in a fresh process without validation (its first one
        validated it), rounds alternating the order (the last first every other round); each process's medians join
        its result's `runoff`. A process that fails is said in the result's warnings and leaves it as it was."""
        if rounds < 1 or not names:
            return
        by_name = {r.recipe: r for r in self.finished}
        self.progress(f"recipes: runoff of {', '.join(names)}: within {PROCESS_SPREAD:.2f}x of their tier's winner by "
                      f"{metric.replace('_', '-')}; {rounds} more process(es) each")
        for index in range(rounds):
            order = names[::-1] if index % 2 == 0 else names
            executor = ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="runoff")
            try:
                for name, times in zip(order, executor.map(self._again, order), strict=True):
                    result = by_name[name]
                    if isinstance(times, str):
                        result.warnings.append(f"a runoff process failed ({times[:160]}): its time rests on "
                                               f"{len(result.runoff) + 1} process(es)")
                        continue
                    result.runoff.append(times)
                    self.progress(f"recipes: runoff [{index + 1}/{rounds}] {name}: "
                                  f"{times.latency_ns / 1e6:.3f} ms latency, {times.back_to_back_ns / 1e6:.3f} ms "
                                  f"back-to-back (now {(result.time_ns(metric) or 0) / 1e6:.3f} ms by "
                                  f"{metric.replace('_', '-')}, the median of {len(result.runoff) + 1} processes)")
            except BaseException as exc:
                self.stopped = str(exc) or type(exc).__name__
                raise
            finally:
                executor.shutdown(wait=True, cancel_futures=True)

    def _again(self, name: str) -> ProcessTimes | str:
        """One more process of recipe `name`, timed only: its medians, or why it failed."""
        try:
            measured = measure(self.path, Way(recipe=name), self.python, self.options, self.scratch,
                               f"runoff_{name.replace('+', '_')}", self.timeout_s, quiet, self.cancel, self.lock)
        except (ChildTimedOut, WorkloadError) as exc:
            return exc.message
        raw = measured.raw
        return ProcessTimes(latency_ns=summarize(raw["latency_ns"]).median_ns,
                            back_to_back_ns=summarize(raw["back_to_back_ns"]).median_ns,
                            wall_time_s=round(measured.wall_time_s, 3))

    def run(self, name: str, stage: str) -> tuple[RecipeResult, dict[str, Any] | None]:
        """One recipe in its own process: its result, and the child's JSON when it ran."""
        t0 = time.monotonic()
        try:
            measured = measure(self.path, Way(recipe=name), self.python, self.options, self.scratch,
                               name.replace("+", "_"), self.timeout_s, quiet, self.cancel, self.lock, self.seeds,
                               keep_failed_log=self.failed_logs)
        except ChildTimedOut as exc:
            return _failed(name, stage, "timed_out", exc.message, time.monotonic() - t0), None
        except WorkloadError as exc:
            return _failed(name, stage, "failed", exc.message, time.monotonic() - t0), None
        return _result(name, stage, measured, self.written), measured.raw

    def close(self) -> None:
        """Remove the children's scratch folder (their JSON and logs, the GPU's lock files)."""
        shutil.rmtree(self.scratch, ignore_errors=True)


def _failed(name: str, stage: str, status: str, reason: str, wall: float) -> RecipeResult:
    return RecipeResult(recipe=name, stage=stage, status=status, reason=reason,  # type: ignore[arg-type]
                        wall_time_s=round(wall, 3))


def _result(name: str, stage: str, measured: Measured, written: RecipeError | None = None) -> RecipeResult:
    raw = measured.raw
    device = raw.get("device_type", "cpu")
    base = dict(recipe=name, stage=stage, wall_time_s=round(measured.wall_time_s, 3),
                warnings=list(raw.get("warnings", [])),
                code=recipe_code(name, device, (raw.get("model") or {}).get("inputs_form", "tuple")))
    if raw.get("not_applicable"):
        return RecipeResult(**base, status="not_applicable", reason=raw["not_applicable"])  # type: ignore[arg-type]
    error = recipe_error(raw.get("validation") or {})
    return RecipeResult(
        **base, status="ok", tier=tier_of(name, error, written),  # type: ignore[arg-type]
        latency=summarize(raw["latency_ns"]), back_to_back=summarize(raw["back_to_back_ns"]),
        first_call_ns=int(raw["first_call_ns"]), error=error,
    )


def recipe_error(validation: dict[str, Any]) -> RecipeError:
    """A recipe's error over every seed and output, from the child's validation entries."""
    outputs = validation.get("outputs", [])
    problems = [p for found in validation.get("problems", {}).values() for p in found]
    problems += [f"seed {o['seed']}, {o['output']}: {o.get('note') or 'values differ'}" for o in outputs
                 if o.get("max_rel_error") is None and not o.get("passed", True)]
    rel = [o["max_rel_error"] for o in outputs if o.get("max_rel_error") is not None]
    absolute = [o["max_abs_error"] for o in outputs if o.get("max_abs_error") is not None]
    pct: dict[str, float] = {}
    for o in outputs:
        for key, value in (o.get("rel_error_percentiles") or {}).items():
            pct[key] = max(pct.get(key, 0.0), value)
    return RecipeError(seeds=list(validation.get("seeds", [])), outputs_compared=len(outputs),
                       max_abs_error=max(absolute) if absolute else None, max_rel_error=max(rel) if rel else None,
                       rel_error_percentiles=pct or None, problems=problems)


def tier_of(name: str, error: RecipeError, written: RecipeError | None = None) -> str | None:
    """The tightest tier a recipe's error meets: exact needs fp32 (TF32 off) and float32's tolerance; reduced, 1e-2;
    fp8, its looser tolerance. None when nothing was compared, or a problem no tolerance excuses (NaN, shapes,
    differing integers) was met. `written`: for a model written in bfloat16/float16, the workload as written against
    itself in float32; two implementations of it, each that far from fp32, may differ by twice its largest error,
    which is then every tier's tolerance at least (`tier_floor`)."""
    if error.problems or error.outputs_compared == 0:
        return None
    worst = error.max_rel_error or 0.0
    floor = tier_floor(written)
    if recipe_parts(name)[1] == "fp32" and worst <= max(TIER_RTOL["exact"], floor):
        return "exact"
    return next((t for t in TIERS[1:] if worst <= max(TIER_RTOL[t], floor)), None)


def tier_floor(written: RecipeError | None) -> float:
    """The least tolerance of every tier for a model written below fp32: twice the largest relative error of the
    model as written against itself in float32 (0 for a model written in float32)."""
    return written_floor(written.max_rel_error if written is not None else None)


def _ranked(results: list[RecipeResult], metric: Metric) -> list[RecipeResult]:
    ok = sorted((r for r in results if r.time_ns(metric) is not None), key=lambda r: r.time_ns(metric) or 0.0)
    return ok + [r for r in results if r.time_ns(metric) is None]


def _winners(results: list[RecipeResult], reference: RecipeResult) -> list[Winner]:
    found = []
    for metric in METRICS:
        ref = reference.time_ns(metric)
        for tier in TIERS:
            allowed = tiers_within(tier)
            valid = [r for r in results if r.status == "ok" and r.tier in allowed and r.time_ns(metric) is not None]
            if not valid:
                continue
            best = min(valid, key=lambda r: r.time_ns(metric) or 0.0)
            time_ns = best.time_ns(metric) or 0.0
            found.append(Winner(tier=tier, metric=metric, recipe=best.recipe, time_ns=time_ns,  # type: ignore[arg-type]
                                speedup_vs_reference=ref / time_ns if ref and time_ns else None,
                                max_rel_error=best.error.max_rel_error if best.error else None, code=best.code))
    return found


def _pareto(results: Iterable[RecipeResult]) -> list[str]:
    """Validated recipes no other validated one beats on both latency and error."""
    points = [(r.recipe, r.time_ns("latency") or 0.0, (r.error.max_rel_error or 0.0) if r.error else 0.0)
              for r in results if r.status == "ok" and r.tier is not None and r.latency is not None]
    return [name for name, t, e in sorted(points, key=lambda p: p[1])
            if not any((t2 < t and e2 <= e) or (t2 <= t and e2 < e) for _, t2, e2 in points)]


REASON_CHARS = 200  # of a failed recipe's reason in its progress line


def short_reason(reason: str) -> str:
    """A failed recipe's reason as one line: whole when short, else the message before the child's last lines."""
    return reason if len(reason) <= REASON_CHARS else reason.split(" (last lines: ")[0][:REASON_CHARS]


def _line(result: RecipeResult) -> str:
    if result.status != "ok":
        return f"{result.recipe}: {result.status.replace('_', ' ')} ({short_reason(result.reason or '')})"
    error = result.error.max_rel_error if result.error is not None else None
    err = f"max rel error {error:.1e}" if error is not None else "no float output"
    return (f"{result.recipe}: {(result.time_ns('latency') or 0) / 1e6:.3f} ms latency, "
            f"{(result.time_ns('back_to_back') or 0) / 1e6:.3f} ms back-to-back, {err}, "
            f"tier {result.tier or 'none (failed validation)'}")
