"""Statistics of timed calls, in pure Python: percentiles, summaries, and the speedup's bootstrap interval.

Times come in rounds (one fresh process each): two processes of the same code can differ (which Triton
configuration autotuning picked, where the allocator placed buffers, the host's state), so the interval resamples
rounds first and each chosen round's calls second, and a ratio measured in one process alone never looks surer than
the rounds allow. A fixed seed makes the interval a function of the times.
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

Rounds = Sequence[Sequence[float]]


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
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = min(percentile(ratios, tail), point), max(percentile(ratios, 100.0 - tail), point)
    return SpeedupEstimate(point=point, ci_low=low, ci_high=high, ci_level=level, resamples=resamples,
                           bootstrap_seed=seed, significant=not (low <= 1.0 <= high))
