"""Per-rank event tables: each window kernel of a rank's profile (each operator call, in a CPU-only profile) as
one row of `rank<R>/events.parquet`.

One schema serves every rank and every scale (a real profile, or a synthetic run of 512 ranks): the merge is SQL
over the files, so it never holds more than DuckDB's own working set. A collective is an NCCL kernel
(`ncclDevKernel_AllReduce_Sum_f32_RING_LL` -> `allreduce`) or, on the CPU, the backend's transfer
(`gloo:all_reduce`); its `seq` is the sequence number the assembly gave it (`mcp_server/assemble/collectives.py`:
its ordinal among the rank's collectives of that type in the window), which aligns the same call across ranks.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from mcp_server.assemble.collectives import kernel_collective
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord

EVENTS_FILE = "events.parquet"
COLUMNS = (
    ("rank", "INTEGER"), ("kernel_id", "BIGINT"), ("name", "VARCHAR"), ("start_ns", "BIGINT"), ("end_ns", "BIGINT"),
    ("stream_id", "BIGINT"), ("phase", "VARCHAR"), ("operator", "VARCHAR"), ("module_path", "VARCHAR"),
    ("collective", "VARCHAR"), ("seq", "BIGINT"), ("weight", "DOUBLE"),
)


def profile_events(profile: OperatorAttributedProfile, rank: int) -> Iterator[tuple[object, ...]]:
    """The rank's window events as rows (COLUMNS' order), in launch order: its kernels; in a CPU-only profile its
    operator calls, host time (a collective's c10d call and its backend's transfer share one sequence number: the
    call's start is the rank's arrival).

    A collective carrying several modules' gradients (a DDP bucket) is one row per module, each weighted by the
    module's share: sums weighted by `weight` count each event once, and split its time among its modules.
    Times are on the capturing tool's clock (the window's start on it plus the event's offset), which the ranks of
    one node share: their arrivals at a collective compare directly."""
    kernels: list[tuple[KernelRecord, OperatorRecord | None]] = [
        (k, op) for op in profile.operators for k in op.kernels]
    kernels += [(k, None) for k in profile.unattributed_kernels]
    if not kernels:
        yield from _host_events(profile, rank)
        return
    kernels.sort(key=lambda pair: pair[0].kernel_id)
    origin = profile.capture_metadata.window_clock_start_ns or 0
    counts: dict[str, int] = {}
    for kernel, op in kernels:
        name = op.operator_name if op is not None else None
        collective = kernel_collective(kernel.kernel_name)  # on a GPU, only NCCL's kernels communicate
        seq = op.collective_seq if collective is not None and op is not None else None
        if collective is not None and seq is None:
            seq = counts[collective] = counts.get(collective, -1) + 1
        module = kernel.module_path or (op.module_path if op else None)
        for path, weight in _shares(op if collective else None, module):
            start = origin + kernel.start_ns
            yield (rank, kernel.kernel_id, kernel.kernel_name, start, start + kernel.duration_ns,
                   kernel.stream_id, kernel.phase or (op.phase if op else None), name, path, collective, seq, weight)


def _host_events(profile: OperatorAttributedProfile, rank: int) -> Iterator[tuple[object, ...]]:
    calls = [op for op in profile.operators if op.host_start_ns is not None]
    calls.sort(key=lambda op: op.host_start_ns or 0)
    origin = profile.capture_metadata.window_clock_start_ns or 0
    for number, op in enumerate(calls):
        start = origin + (op.host_start_ns or 0)
        for path, weight in _shares(op, op.module_path):
            collective = op.collective if op.collective_seq is not None else None  # unpaired: counted as compute
            yield (rank, number, op.operator_name, start, start + (op.aggregated.cpu_total_time_ns or 0), None,
                   op.phase, op.operator_name, path, collective, op.collective_seq, weight)


def _shares(op: OperatorRecord | None, module: str | None) -> list[tuple[str | None, float]]:
    if op is not None and op.collective_modules:
        return list(op.collective_modules.items())
    return [(module, 1.0)]


def write_events(rows: Iterable[tuple[object, ...]], path: Path) -> Path:
    """Write event rows to a Parquet file atomically (DuckDB's COPY from a temporary CSV beside it)."""
    import duckdb

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(prefix=".events-", suffix=".csv", dir=path.parent)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows(rows)
        types = ", ".join(f"'{name}': '{kind}'" for name, kind in COLUMNS)
        with duckdb.connect() as con:
            con.execute(
                f"COPY (SELECT * FROM read_csv(?, header = false, columns = {{{types}}}, nullstr = '')) "
                "TO ? (FORMAT parquet)", [scratch, str(partial)],
            )
        os.replace(partial, path)
    finally:
        Path(scratch).unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return path


def write_rank_events(profile: OperatorAttributedProfile, rank: int, folder: Path) -> Path:
    """`folder/events.parquet` of one rank's profile."""
    return write_events(profile_events(profile, rank), Path(folder) / EVENTS_FILE)
