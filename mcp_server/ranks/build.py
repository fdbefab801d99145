"""A multi-rank run's derived files: each rank's profile.json and events.parquet, then ranks.json merged from
every rank's events (DuckDB over the Parquet files)."""

from __future__ import annotations

from mcp_server.assemble.unprofiled import RankTiming, rank_timing
from mcp_server.ranks.event_tables import write_rank_events
from mcp_server.ranks.merge import merge_ranks, rank_files
from mcp_server.rundir import RunDir
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.ranks import RanksSummary


def write_events_of(run_dir: RunDir, profile: OperatorAttributedProfile) -> None:
    """`events.parquet` beside a rank's profile (nothing for a single-process profile)."""
    info = profile.capture_metadata.distributed
    if info is not None:
        write_rank_events(profile, info.rank, run_dir.path)


def merge_run(run_dir: RunDir) -> RanksSummary:
    """ranks.json of a multi-rank run whose ranks' events are written, with each rank's timing pass; returned and
    written atomically."""
    ranks = run_dir.ranks()
    timing: dict[int, RankTiming] = {}
    for rank in ranks:
        if (timed := rank_timing(run_dir.rank_dir(rank))) is not None:
            timing[rank] = timed
    summary = merge_ranks(rank_files(run_dir.path), timing=timing)
    if len(ranks) != summary.world_size:
        summary.notes.append(f"{len(ranks)} rank folders here, {summary.world_size} with events")
    write_model_atomic(run_dir.ranks_path, summary)
    return summary
