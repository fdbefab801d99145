"""The cross-rank merge: `ranks.json` from every rank's `events.parquet`, as SQL in an embedded DuckDB.

Per rank: the window, the unions of compute and of communication intervals (gaps and islands over the events
ordered by start), their overlap and the idle rest, collective time per type and per module. Across ranks:
each collective call (type, seq) with its arrival skew — the last rank's start minus the first's, on the
capturing tool's clock, which the ranks of one node share — each rank's mean lateness, and the stragglers: the
ranks the others wait for (`stragglers`).

Where each rank ran a timing pass, its window without the profiler and its time in collectives under that pass's
kernel trace (a lighter tool than nsys) join the merge: a straggler stands only when the others wait for it there
too and their window without the profiler leaves room beside their compute for that wait. nsys slows a rank's host
work, and a host-bound rank's more than the others': the rank it slowed most looks late (`unconfirmed_stragglers`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from mcp_server.assemble.unprofiled import RankTiming
from mcp_server.errors import UsageError
from mcp_server.schema.ranks import CollectiveSkew, RanksSummary, RankTimes, Straggler

WORST = 10
THREADS = 2
STRAGGLER_FLOOR = 0.05  # of the median window: less waiting than this is noise, not a straggler

_UNIONS = """
WITH one AS (SELECT * FROM read_parquet(?)), e AS (
    SELECT DISTINCT rank, CASE WHEN collective IS NULL THEN 'compute' ELSE 'communication' END AS kind, start_ns,
           end_ns
    FROM one
    UNION SELECT rank, 'all' AS kind, start_ns, end_ns FROM one
), o AS (
    SELECT *, max(end_ns) OVER (PARTITION BY rank, kind ORDER BY start_ns, end_ns
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before_end
    FROM e
), g AS (
    SELECT *, sum(CASE WHEN before_end IS NULL OR start_ns > before_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, kind ORDER BY start_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM o
), islands AS (
    SELECT rank, kind, island, min(start_ns) AS s, max(end_ns) AS e FROM g GROUP BY rank, kind, island
)
SELECT rank, kind, sum(e - s)::BIGINT FROM islands GROUP BY rank, kind
"""
# One row per interval: a collective's kernel has a row per module of its bucket, and rows that tie on (start, end)
# may come in another order in the second window than in the first, which would carry an island's number across the
# gap before it.
# A row's weight is its share of its event (a collective split among its bucket's modules): weighted sums count
# each event once.
_WINDOWS = "SELECT rank, (max(end_ns) - min(start_ns))::BIGINT, round(sum(weight))::BIGINT FROM ev GROUP BY rank"
_BY_COLLECTIVE = """SELECT rank, collective, round(sum((end_ns - start_ns) * weight))::BIGINT FROM ev
                    WHERE collective IS NOT NULL GROUP BY rank, collective"""
_BY_MODULE = """SELECT rank, coalesce(module_path, '(no module)'), round(sum((end_ns - start_ns) * weight))::BIGINT
                FROM ev WHERE collective IS NOT NULL GROUP BY rank, module_path"""
_ARRIVALS = """
CREATE TEMP TABLE arrivals AS
SELECT collective, seq, rank, min(start_ns) AS arrival, max(end_ns) - min(start_ns) AS span FROM ev
WHERE collective IS NOT NULL GROUP BY collective, seq, rank
"""
_CALLS = """
CREATE TEMP TABLE calls AS
SELECT collective, seq, count(*) AS ranks, (max(arrival) - min(arrival))::BIGINT AS skew,
       arg_max(rank, arrival) AS last_rank, arg_min(rank, arrival) AS first_rank, min(arrival) AS first_arrival
FROM arrivals GROUP BY collective, seq
"""
_LATENESS = """
SELECT a.rank, avg(a.arrival - c.first_arrival), sum(CASE WHEN c.last_rank = a.rank AND c.skew > 0 THEN 1 ELSE 0 END),
       sum(least(a.span, c.first_arrival + c.skew - a.arrival))::BIGINT
FROM arrivals a JOIN calls c USING (collective, seq) GROUP BY a.rank
"""


def rank_files(run_dir: Path) -> list[Path]:
    """`rank<R>/events.parquet` of a run directory, by rank."""
    found = sorted(Path(run_dir).glob("rank*/events.parquet"), key=lambda p: int(p.parent.name.removeprefix("rank")))
    if not found:
        raise UsageError(f"no rank<R>/events.parquet under {run_dir}",
                         "pass the run directory of a multi-rank capture (or write each rank's events first)")
    return found


def merge_ranks(files: list[Path], memory_limit: str | None = None,
                timing: Mapping[int, RankTiming] | None = None) -> RanksSummary:
    """ranks.json's content from the ranks' event files (one per rank; SQL over all of them, the interval unions
    one file at a time), with each rank's timing pass where `timing` has it."""
    import duckdb

    t0 = time.monotonic()
    with duckdb.connect() as con:
        con.execute(f"SET threads = {THREADS}")
        con.execute("SET enable_progress_bar = false")
        if memory_limit:
            con.execute("SET memory_limit = ?", [memory_limit])
        con.read_parquet([str(f) for f in files]).create_view("ev")
        windows = {r: (w, n) for r, w, n in con.execute(_WINDOWS).fetchall()}
        unions: dict[int, dict[str, int]] = {}
        for path in files:  # one rank's file at a time: the window functions hold one rank, never the run
            for rank, kind, ns in con.execute(_UNIONS, [str(path)]).fetchall():
                if kind in unions.setdefault(rank, {}):
                    raise UsageError(f"rank {rank}'s events are split over several files ({path})",
                                     "write one events.parquet per rank")
                unions[rank][kind] = ns
        by_collective: dict[int, dict[str, int]] = {}
        for rank, name, ns in con.execute(_BY_COLLECTIVE).fetchall():
            by_collective.setdefault(rank, {})[name] = ns
        by_module: dict[int, dict[str, int]] = {}
        for rank, name, ns in con.execute(_BY_MODULE).fetchall():
            by_module.setdefault(rank, {})[name] = ns
        con.execute(_ARRIVALS)
        con.execute(_CALLS)
        calls, median, worst_skew = con.execute(
            "SELECT count(*), median(skew), max(skew) FROM calls").fetchone() or (0, None, None)
        worst = [CollectiveSkew(collective=c, seq=s, ranks=n, skew_ns=k, last_rank=last, first_rank=first)
                 for c, s, n, k, last, first in con.execute(
                     "SELECT collective, seq, ranks, skew, last_rank, first_rank FROM calls "
                     "ORDER BY skew DESC, collective, seq LIMIT ?", [WORST]).fetchall()]
        lateness = {rank: (float(mean or 0.0), int(last or 0), int(waiting or 0))
                    for rank, mean, last, waiting in con.execute(_LATENESS).fetchall()}
    ranks = []
    for rank in sorted(windows):
        window, _ = windows[rank]
        kinds = unions.get(rank, {})
        compute, comm, busy = kinds.get("compute", 0), kinds.get("communication", 0), kinds.get("all", 0)
        mean, last, waiting = lateness.get(rank, (0.0, 0, 0))
        timed = (timing or {}).get(rank)
        ranks.append(RankTimes(
            rank=rank, window_ns=window, compute_ns=compute, communication_ns=comm,
            overlap_ns=compute + comm - busy, idle_ns=max(0, window - busy),
            overlap_pct=100.0 * (compute + comm - busy) / comm if comm else None,
            communication_by_collective_ns=by_collective.get(rank, {}),
            communication_by_module_ns=by_module.get(rank, {}), mean_lateness_ns=mean, last_arrivals=last,
            waiting_ns=waiting, unprofiled_window_ns=timed.window_ns if timed else None,
            traced_communication_ns=timed.communication_ns if timed else None,
        ))
    late, unconfirmed = stragglers(ranks, int(calls or 0))
    return RanksSummary(
        world_size=len(ranks), events=sum(n for _, n in windows.values()), ranks=ranks, collectives=int(calls or 0),
        skew_ns_median=float(median) if median is not None else None,
        skew_ns_max=int(worst_skew) if worst_skew is not None else None, worst_collectives=worst,
        stragglers=late, unconfirmed_stragglers=unconfirmed,
        merge_seconds=round(time.monotonic() - t0, 3),
        notes=[] if calls else ["no collective in any rank's window: nothing to align across ranks"],
    )


def stragglers(ranks: list[RankTimes], calls: int) -> tuple[list[Straggler], list[Straggler]]:
    """(stragglers, unconfirmed): ranks the others wait for. Their time in collectives is below the others' median
    by at least STRAGGLER_FLOOR of the median window and by at least half the largest such gap, under the profiler.
    Where every rank ran a timing pass, two measurements must leave room for that wait too, each at least
    STRAGGLER_FLOOR of the window timed without the profiler: the same gap in the pass's kernel trace (a lighter
    tool than nsys), and the others' window timed without any profiler less their compute (no rank can wait longer
    than its GPU spends outside compute). A rank late under the profiler alone is unconfirmed.

    Arrival order alone misleads: a rank blocked in one collective by a late peer arrives late at the next, and
    a rank that a tree-shaped collective released early arrives first. Waiting does not: every rank but the late
    one waits for it inside a collective, so the late rank spends the least time in them, short by about its
    delay."""
    if calls == 0 or len(ranks) < 2:
        return [], []
    floor = STRAGGLER_FLOOR * _median([r.window_ns for r in ranks])
    gaps = _gaps({r.rank: r.communication_ns for r in ranks})
    traced = {r.rank: r.traced_communication_ns for r in ranks if r.traced_communication_ns is not None}
    traced_gaps = _gaps(traced) if len(traced) == len(ranks) else {}
    timed = all(r.unprofiled_window_ns for r in ranks)
    unprofiled_floor = STRAGGLER_FLOOR * _median([r.unprofiled_window_ns or 0 for r in ranks]) if timed else floor
    largest = max(gaps.values())
    found: list[Straggler] = []
    unconfirmed: list[Straggler] = []
    for r in ranks:
        gap = gaps[r.rank]
        if gap < floor or gap < 0.5 * largest:
            continue
        reason = (f"spent {gap / 1e6:.3f} ms less in collectives than the other ranks' median: they waited for it "
                  f"(it arrived last at {r.last_arrivals} of {calls} collective calls)")
        there = traced_gaps.get(r.rank)
        if there is not None:
            reason += f"; in the timing pass's kernel trace (no nsys) {there / 1e6:.3f} ms less per window"
        bound = _median([max(0, (o.unprofiled_window_ns or 0) - o.compute_ns) for o in ranks if o.rank != r.rank]
                        ) if timed else None
        if bound is not None:
            reason += (f"; without the profiler the others' windows leave at most {bound / 1e6:.3f} ms beside their "
                       "compute")
        late = Straggler(rank=r.rank, caused_wait_ns=round(gap), mean_lateness_ns=r.mean_lateness_ns,
                         last_arrival_share_pct=100.0 * r.last_arrivals / calls, reason=reason,
                         traced_caused_wait_ns=round(there) if there is not None else None,
                         unprofiled_bound_ns=round(bound) if bound is not None else None)
        short = [what for what, ns in (("the kernel trace's wait", there), ("that room", bound))
                 if ns is not None and ns < unprofiled_floor]
        if not short:
            found.append(late)
        else:
            unconfirmed.append(late.model_copy(update={"reason": reason + (
                f": {' and '.join(short)} under {unprofiled_floor / 1e6:.3f} ms ({STRAGGLER_FLOOR:.0%} of the window "
                "timed without the profiler); the profiler slowed the ranks unevenly, not a straggler without it")}))
    return found, unconfirmed


def _gaps(communication: Mapping[int, int]) -> dict[int, float]:
    """Each rank's time in collectives below the other ranks' median."""
    return {rank: _median([ns for other, ns in communication.items() if other != rank]) - ns
            for rank, ns in communication.items()}


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
