"""Per-rank event tables: each window kernel of a rank's profile as one row of `rank<R>/events.parquet`.

One schema serves every rank and every scale (a real profile, or a synthetic run of 512 ranks): the merge is SQL
over the files, so it never holds more than DuckDB's own working set. A collective is recognised by its NCCL
kernel name (`ncclDevKernel_AllReduce_Sum_f32_RING_LL` -> `allreduce`) or its c10d operator
(`c10d::allreduce_`); its `seq` is its ordinal among the rank's collectives of that type in the window, which
aligns the same call across ranks (every rank issues the same collectives in the same order).
"""

from __future__ import annotations

import csv
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord

EVENTS_FILE = "events.parquet"
COLUMNS = (
    ("rank", "INTEGER"), ("kernel_id", "BIGINT"), ("name", "VARCHAR"), ("start_ns", "BIGINT"), ("end_ns", "BIGINT"),
    ("stream_id", "BIGINT"), ("phase", "VARCHAR"), ("operator", "VARCHAR"), ("module_path", "VARCHAR"),
    ("collective", "VARCHAR"), ("seq", "BIGINT"),
)
_NCCL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_C10D = re.compile(r"^c10d::([a-z_]+?)_?$")


def collective_of(kernel_name: str, operator: str | None) -> str | None:
    """The collective a kernel runs (`allreduce`, `allgather`, `reducescatter`, `broadcast`, ...), or None."""
    found = _NCCL.search(kernel_name)
    if found:
        return found.group(1).lower()
    op = _C10D.match(operator or "")
    return op.group(1).replace("_", "").removesuffix("base").removesuffix("into") if op else None


def profile_events(profile: OperatorAttributedProfile, rank: int) -> Iterator[tuple[object, ...]]:
    """The rank's window kernels as event rows, in launch order (COLUMNS' order)."""
    kernels: list[tuple[KernelRecord, OperatorRecord | None]] = [
        (k, op) for op in profile.operators for k in op.kernels]
    kernels += [(k, None) for k in profile.unattributed_kernels]
    kernels.sort(key=lambda pair: pair[0].kernel_id)
    counts: dict[str, int] = {}
    for kernel, op in kernels:
        name = op.operator_name if op is not None else None
        collective = collective_of(kernel.kernel_name, name)
        seq = None
        if collective is not None:
            seq = counts[collective] = counts.get(collective, -1) + 1
        yield (rank, kernel.kernel_id, kernel.kernel_name, kernel.start_ns, kernel.start_ns + kernel.duration_ns,
               kernel.stream_id, kernel.phase or (op.phase if op else None), name,
               kernel.module_path or (op.module_path if op else None), collective, seq)


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
