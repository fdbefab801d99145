"""`ranks.json`: the merged view of a multi-rank run, computed by SQL over the ranks' Parquet event tables."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

RANKS_VERSION = "1.1"  # 1.1: time spent waiting in collectives, the timing pass's window and collectives,
# stragglers that the profiler alone made


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RankTimes(_Model):
    """One rank's window: where its device time went (ns, on the rank's own clock from its window start)."""

    rank: int
    window_ns: int = Field(description="First event start to last event end.")
    compute_ns: int = Field(description="Union of compute (non-collective) intervals.")
    communication_ns: int = Field(description="Union of collective intervals.")
    overlap_ns: int = Field(description="Time when compute and communication ran at once.")
    idle_ns: int = Field(description="Window time when nothing ran.")
    overlap_pct: float | None = Field(default=None, description="overlap_ns / communication_ns, 0-100.")
    communication_by_collective_ns: dict[str, int] = Field(default_factory=dict)
    communication_by_module_ns: dict[str, int] = Field(
        default_factory=dict, description="Collective time by the module whose gradients or parameters it carries."
    )
    mean_lateness_ns: float = Field(default=0.0, description="Mean arrival after the first rank, over collectives.")
    last_arrivals: int = Field(default=0, description="Collectives this rank arrived at last.")
    waiting_ns: int = Field(default=0, description="Of communication_ns, the time spent waiting for the last rank to "
                            "arrive: each call's last arrival minus this rank's, at most the call's length (1.1).")
    unprofiled_window_ns: int | None = Field(default=None, description="The window timed without the profiler "
                                             "(the timing pass; median), ns; None without a timing pass (1.1).")
    traced_communication_ns: int | None = Field(
        default=None, description="Union of the collectives' kernels in one window of the timing pass's kernel trace "
        "(CUPTI activity only, no nsys; mean over its traced windows), ns: the same split measured under a lighter "
        "tool (1.1).")


class CollectiveSkew(_Model):
    """One collective call across ranks, aligned by its type and sequence number."""

    collective: str
    seq: int
    ranks: int = Field(description="How many ranks took part.")
    skew_ns: int = Field(description="Last rank's arrival minus the first rank's.")
    last_rank: int
    first_rank: int


class Straggler(_Model):
    """A rank the others wait for in their collectives."""

    rank: int
    caused_wait_ns: int = Field(description="The other ranks' median time in collectives minus this rank's: about "
                                            "how long they waited for it in the window.")
    mean_lateness_ns: float
    last_arrival_share_pct: float
    reason: str
    traced_caused_wait_ns: int | None = Field(
        default=None, description="The same difference in the timing pass's kernel trace (no nsys), ns; None without "
        "one (1.1).")
    unprofiled_bound_ns: int | None = Field(
        default=None, description="The most the other ranks can have waited for it without the profiler: their window "
        "timed without it less their compute (median over them), ns; None without a timing pass (1.1).")


class RanksSummary(_Model):
    """ranks.json."""

    ranks_version: str = RANKS_VERSION
    world_size: int
    events: int = Field(description="Events merged over all ranks.")
    ranks: list[RankTimes]
    collectives: int = Field(description="Collective calls aligned across ranks.")
    skew_ns_median: float | None = None
    skew_ns_max: int | None = None
    worst_collectives: list[CollectiveSkew] = Field(default_factory=list, description="Largest skews first.")
    stragglers: list[Straggler] = Field(default_factory=list, description="Ranks the others wait for, under the "
                                        "profiler and, where a timing pass ran, in its kernel trace and within the "
                                        "room its window leaves beside their compute.")
    unconfirmed_stragglers: list[Straggler] = Field(
        default_factory=list, description="Ranks the others waited for under nsys but not in the timing pass's kernel "
        "trace, or for longer than its window leaves room for: the profiler slowed the ranks unevenly; not findings "
        "(1.1).")
    merge_seconds: float = Field(description="Wall time of the merge (DuckDB over the Parquet files).")
    notes: list[str] = Field(default_factory=list)
