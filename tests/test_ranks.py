"""The rank merge: Parquet event tables per rank, merged by SQL in DuckDB. Synthetic ranks with a known straggler
(scripts/make_synthetic_ranks.py), hand-made overlapping events, and a recorded H100 profile written as ranks;
unions and skews are recomputed here in plain Python from the same rows."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

import duckdb
import pytest
from conftest import REPO
from fixtures_util import extract_fixture, interval_union

from mcp_server.assemble.collectives import kernel_collective, operator_collective
from mcp_server.backends.registry import assemble
from mcp_server.errors import UsageError
from mcp_server.ranks.event_tables import EVENTS_FILE, profile_events, write_events, write_rank_events
from mcp_server.ranks.merge import merge_ranks, rank_files
from mcp_server.rundir import RunDir

_spec = importlib.util.spec_from_file_location("make_synthetic_ranks", REPO / "scripts" / "make_synthetic_ranks.py")
synthetic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synthetic)


def _rows(files: list[Path]) -> list[tuple]:
    with duckdb.connect() as con:
        return con.read_parquet([str(f) for f in files]).fetchall()


def test_collectives_are_named_from_nccl_kernels_and_c10d_ops():
    assert kernel_collective("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == (
        "allreduce")
    assert kernel_collective("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "allgather"
    assert kernel_collective("void at::native::elementwise_kernel<128, 2>") is None
    assert operator_collective("c10d::broadcast_") == "broadcast"
    assert operator_collective("gloo:all_reduce") == "allreduce"
    assert kernel_collective("sm90_xmma_gemm") is None and operator_collective("aten::mm") is None


@pytest.mark.parametrize("ranks,straggler,delay_us", [(2, 1, 300.0), (4, 2, 200.0)])
def test_the_straggler_is_named_and_the_skew_matches_the_injected_delay(tmp_path, ranks, straggler, delay_us):
    files = synthetic.make_ranks(tmp_path, ranks, 3000, period=50, straggler=straggler,
                                 delay_ns=round(delay_us * 1000))
    summary = merge_ranks(rank_files(tmp_path))
    assert summary.world_size == ranks and summary.events == ranks * 3000 and summary.collectives == 60
    assert [s.rank for s in summary.stragglers] == [straggler]
    assert summary.skew_ns_median == pytest.approx(delay_us * 1000, rel=0.2)
    assert all(c.last_rank == straggler for c in summary.worst_collectives)
    # the same numbers from the rows, in Python
    rows = _rows(files)
    arrivals: dict[tuple[str, int], dict[int, int]] = {}
    for rank, _, _, start, _, _, _, _, _, collective, seq, _ in rows:
        if collective is not None:
            arrivals.setdefault((collective, seq), {})[rank] = start
    skews = [max(a.values()) - min(a.values()) for a in arrivals.values()]
    assert summary.skew_ns_median == pytest.approx(statistics.median(skews))
    for r in summary.ranks:
        mine = [(s, e, c) for rank, _, _, s, e, _, _, _, _, c, _, _ in rows if rank == r.rank]
        assert r.compute_ns == interval_union([(s, e) for s, e, c in mine if c is None])
        assert r.communication_ns == interval_union([(s, e) for s, e, c in mine if c is not None])
        assert r.window_ns == max(e for _, e, _ in mine) - min(s for s, _, _ in mine)
        assert r.communication_by_collective_ns == {"allreduce": sum(e - s for s, e, c in mine if c is not None)}
    waiting = [r.communication_ns for r in summary.ranks if r.rank != straggler]
    assert min(waiting) > next(r.communication_ns for r in summary.ranks if r.rank == straggler)


def test_overlap_and_idle_of_hand_made_events(tmp_path):
    # rank 0: compute 0-100 and 150-300, an all-reduce 80-200 on a second stream (overlap 20 + 50), idle 0
    # rank 1: compute 0-50, all-reduce 90-200 (arrives 90: 90 after rank 0), idle 40
    rows = [(0, 0, "k", 0, 100, 0, "backward", "aten::mm", "fc", None, None, 1.0),
            (0, 1, "ncclDevKernel_AllReduce_Sum_f32", 80, 200, 1, None, "c10d::allreduce_", "fc", "allreduce", 0, 1.0),
            (0, 2, "k", 150, 300, 0, "backward", "aten::mm", "fc", None, None, 1.0),
            (1, 0, "k", 0, 50, 0, "backward", "aten::mm", "fc", None, None, 1.0),
            (1, 1, "ncclDevKernel_AllReduce_Sum_f32", 90, 200, 1, None, "c10d::allreduce_", "fc", "allreduce", 0, 1.0)]
    for rank in (0, 1):
        write_events([r for r in rows if r[0] == rank], tmp_path / f"rank{rank}" / EVENTS_FILE)
    summary = merge_ranks(rank_files(tmp_path))
    first, second = summary.ranks
    assert (first.compute_ns, first.communication_ns, first.overlap_ns, first.idle_ns) == (250, 120, 70, 0)
    assert first.overlap_pct == pytest.approx(100 * 70 / 120)
    assert (second.compute_ns, second.communication_ns, second.overlap_ns, second.idle_ns) == (50, 110, 0, 40)
    assert first.communication_by_module_ns == {"fc": 120}
    assert summary.worst_collectives[0].skew_ns == 10 and summary.worst_collectives[0].last_rank == 1
    assert not (tmp_path / "rank0" / f".{EVENTS_FILE}.partial").exists()


def test_a_recorded_profile_as_ranks_keeps_its_kernels_and_busy_time(tmp_path, tmp_path_factory):
    run = extract_fixture("h100_encoder_train_step_eager_train", tmp_path_factory) / "encoder_train_step_eager_train"
    profile = assemble(RunDir(run))
    for rank in (0, 1):
        write_rank_events(profile, rank, tmp_path / f"rank{rank}")
    summary = merge_ranks(rank_files(tmp_path))
    assert summary.events == 2 * profile.window.kernel_count
    for r in summary.ranks:
        assert r.compute_ns == profile.window.gpu_busy_time_ns and r.communication_ns == 0
    assert summary.collectives == 0 and summary.stragglers == [] and summary.notes
    phases = {row[6] for row in profile_events(profile, 0)}
    assert phases == {"forward", "backward", "optimizer"}


def test_a_folder_without_rank_tables_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="rank<R>/events.parquet"):
        rank_files(tmp_path)
