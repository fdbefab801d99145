"""Merge time and peak memory of the rank merge at scale, on synthetic ranks (scripts/make_synthetic_ranks.py).

    python benchmarks/measure_rank_merge.py --sizes 8,64,512 --kernels 100000 --work /tmp/rank_scale [--out FILE]

For each size it writes the ranks' Parquet event tables (timed apart), then merges them in a fresh child
process (`mcp_server.ranks.merge.merge_ranks`, DuckDB with 2 threads) and reads that child's peak resident
memory from the kernel (wait4's rusage). One rank is a straggler 200 us late at every collective, so each merge
also checks that it names it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from make_synthetic_ranks import make_ranks  # noqa: E402

CHILD = """
import json, sys
from pathlib import Path
from mcp_server.ranks.merge import merge_ranks, rank_files
summary = merge_ranks(rank_files(Path(sys.argv[1])))
print(json.dumps({"merge_seconds": summary.merge_seconds, "events": summary.events, "collectives": summary.collectives,
                  "stragglers": [s.rank for s in summary.stragglers], "skew_ns_median": summary.skew_ns_median}))
"""


def measure(size: int, kernels: int, work: Path) -> dict[str, object]:
    """Generate `size` ranks, merge them in a child; their numbers."""
    folder = work / f"ranks{size}"
    shutil.rmtree(folder, ignore_errors=True)
    t0 = time.monotonic()
    files = make_ranks(folder, size, kernels, straggler=size - 1, delay_ns=200_000)
    generate = time.monotonic() - t0
    disk = sum(f.stat().st_size for f in files)
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - t0
    if status != 0:
        raise SystemExit(f"merge of {size} ranks failed (status {status})")
    result = json.loads(out)
    shutil.rmtree(folder, ignore_errors=True)
    return {"ranks": size, "events": result["events"], "generate_s": round(generate, 1),
            "parquet_mib": round(disk / 2**20, 1), "merge_s": result["merge_seconds"],
            "child_wall_s": round(wall, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "collectives": result["collectives"], "straggler_named": result["stragglers"] == [size - 1],
            "skew_ns_median": result["skew_ns_median"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,512")
    parser.add_argument("--kernels", type=int, default=100_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/rank_scale"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.append(measure(size, args.kernels, args.work))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
