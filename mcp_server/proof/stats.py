"""Statistics of timed calls, in pure Python: percentiles, summaries, and the speedup's bootstrap interval.

Times come in rounds (one fresh process each): two processes of the same code can differ (which Triton
configuration autotuning picked, where the allocator placed buffers, the host's state), so the interval resamples
rounds first and each chosen round's calls second, and a ratio measured in one process alone never looks surer than
the rounds allow. A fixed seed makes the interval a function of the times. Sides timed in turns
(`proof/turns.py`) pair their blocks: the speedup is the median of the paired blocks' ratios, and its
interval draws block k of both sides together, so a host that slowed both at once moves neither.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

from mcp_server.schema.proof import SpeedupEstimate, TimingSummary

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261121
CI_LEVEL = 0.95
# Per-process medians of one code further apart than this are said, with what it means: a host-bound call runs as
# fast as the host does in that process (bench's sides, the frontier's close recipes).
PROCESS_SPREAD = 1.15
PAIRED_METHOD = ("paired bootstrap of the median of the blocks' ratios of medians (each block over the other "
                 "side's block next to it in time): rounds resampled with replacement (both sides' round together), "
                 "then each chosen round's blocks, then each chosen block's calls")

Rounds = Sequence[Sequence[float]]
Blocks = Sequence[Sequence[Sequence[float]]]  # rounds, then the blocks of each round, then their values


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


def _flat(rounds: Rounds) -> list[float]:
    return [float(v) for r in rounds for v in r]


def _resample(rng: random.Random, rounds: Rounds) -> list[float]:
    """Rounds drawn with replacement, then each drawn round's values drawn with replacement."""
    chosen = rng.choices(rounds, k=len(rounds)) if len(rounds) > 1 else rounds
    return [v for r in chosen for v in rng.choices(r, k=len(r))]


def bootstrap_speedup(
    baseline: Rounds,
    optimized: Rounds,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> SpeedupEstimate:
    """baseline median / optimized median of all calls, with a two-level bootstrap interval (rounds, then calls).

    Each side is a list of rounds, each round the per-call times of one process; times of 0 count as 1 ns.
    """
    base = [[max(float(v), 1.0) for v in r] for r in baseline if len(r)]
    opt = [[max(float(v), 1.0) for v in r] for r in optimized if len(r)]
    if not base or not opt:
        raise ValueError("bootstrap needs samples on both sides")
    rng = random.Random(seed)
    point = statistics.median(_flat(base)) / statistics.median(_flat(opt))
    ratios = [statistics.median(_resample(rng, base)) / statistics.median(_resample(rng, opt))
              for _ in range(resamples)]
    return _estimate(point, ratios, level, seed)


def _estimate(point: float, ratios: list[float], level: float, seed: int, **method: str) -> SpeedupEstimate:
    """The speedup `point` with the central `level` interval of its resampled `ratios` (widened to hold it)."""
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = min(percentile(ratios, tail), point), max(percentile(ratios, 100.0 - tail), point)
    return SpeedupEstimate(point=point, ci_low=low, ci_high=high, ci_level=level, resamples=len(ratios),
                           bootstrap_seed=seed, significant=not (low <= 1.0 <= high), **method)


def pairable(baseline: Blocks, optimized: Blocks) -> bool:
    """Both sides have the same rounds with the same number of non-empty blocks each: block k pairs with block k."""
    return len(baseline) == len(optimized) > 0 and all(
        len(b) == len(o) > 0 and all(len(v) for v in (*b, *o)) for b, o in zip(baseline, optimized, strict=True))


def bootstrap_paired_speedup(
    baseline: Blocks,
    optimized: Blocks,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> SpeedupEstimate:
    """The median of the paired blocks' ratios (block k's median on the baseline over block k's median on
    the optimized side, both timed next to each other in one host state), with a paired bootstrap interval: rounds
    drawn with replacement (both sides' round r together), then each drawn round's blocks (both sides' block k
    together), then each drawn block's values. The sides must be `pairable`; times of 0 count as 1 ns.

    Not the ratio of the pooled medians: when the host's speed moves between rounds, each side's pooled calls have
    two modes, and which mode holds a side's median depends on a few calls (measured on the H200: every round at
    0.98-1.00x, the pooled medians' ratio 0.91x)."""
    if not pairable(baseline, optimized):
        raise ValueError("paired bootstrap needs the same rounds and blocks on both sides")
    base = [[[max(float(v), 1.0) for v in block] for block in r] for r in baseline]
    opt = [[[max(float(v), 1.0) for v in block] for block in r] for r in optimized]
    rng = random.Random(seed)
    point = _paired_median([(b, o) for rb, ro in zip(base, opt, strict=True) for b, o in zip(rb, ro, strict=True)])
    ratios = []
    for _ in range(resamples):
        pairs = []
        for r in (rng.choices(range(len(base)), k=len(base)) if len(base) > 1 else [0]):
            for k in rng.choices(range(len(base[r])), k=len(base[r])):
                pairs.append((rng.choices(base[r][k], k=len(base[r][k])), rng.choices(opt[r][k], k=len(opt[r][k]))))
        ratios.append(_paired_median(pairs))
    return _estimate(point, ratios, level, seed, method=PAIRED_METHOD)


def _paired_median(pairs: list[tuple[list[float], list[float]]]) -> float:
    """The median over paired blocks of (baseline block's median / optimized block's median)."""
    return statistics.median(statistics.median(b) / statistics.median(o) for b, o in pairs)
