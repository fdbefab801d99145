"""`assemble` at scale: a synthetic nsys run directory of 100,000 kernels, complete, within a memory budget and
within a time budget relative to a yardstick measured in the same run.

The issue's target is 1,000,000 kernels in <= 60 s and <= 2 GiB on the CPU machine (2 shared cores). Measured
there (`scripts/make_synthetic_run.py`, then `python -m mcp_server.cli assemble` as a child process):
1,000,000 kernels in 39 s and 1,257 MiB; 100,000 in 4.2 s and 165 MiB, of which 40 MiB is the interpreter
and its imports. A wall-clock bound fails on a loaded machine (26 s against a 12 s bound once), so the time is
held to a yardstick run in the same test, a child that reads every row of the same report.sqlite and serialises
it (`YARDSTICK`): assemble took 2.2 to 2.4 times as long on that machine, idle or loaded, and the assembly these
replaced (15.8 s and 1,290 MiB for 100,000 kernels; 170 s and 12.2 GiB for 1,000,000) about 9 times: the bound is
4 times the slower of two yardstick runs, before and after. Memory does not depend on the load: 512 MiB (the
linear tenth of the target, 40 + 200 MiB, with room to spare).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from mcp_server.assemble import write_profile
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord
from plugins.nsys.reader import read_nsys_sqlite

KERNELS = 100_000
YARDSTICK_FACTOR = 4.0
RSS_BUDGET_MIB = 512
# The machine's speed now: read every row of the run's SQLite export and serialise it (no engine code involved).
YARDSTICK = (
    "import json, sqlite3, sys\n"
    "with sqlite3.connect(sys.argv[1]) as db:\n"
    "    names = [r[0] for r in db.execute(\"SELECT name FROM sqlite_master WHERE type='table'\")]\n"
    "    print(sum(len(json.dumps(db.execute(f'SELECT * FROM \"{n}\"').fetchall())) for n in names))\n"
)
SCRIPT = REPO / "scripts" / "make_synthetic_run.py"


def make_run(kernels: int, out: Path) -> dict[str, int]:
    """A synthetic run directory of `kernels` window kernels (the script's facts: iterations, NVTX ranges...)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(kernels), str(out)], cwd=REPO, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


# Started from a small launcher that waits for it: Linux counts the memory of the process a child was spawned from
# (up to its exec) in the child's peak RSS, and this test process may hold hundreds of MiB after other tests.
LAUNCHER = """
import json, os, subprocess, sys
with open(sys.argv[2], "wb") as out:
    child = subprocess.Popen(sys.argv[3:], stdout=out, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], "w") as measured:
    json.dump([os.waitstatus_to_exitcode(status), usage.ru_maxrss], measured)
"""


def run_measured(args: list[str], cwd: Path, stdout: Path) -> tuple[int, float, float]:
    """Run a child process; return its exit status, wall seconds and peak RSS in MiB (its own, from wait4 in the
    launcher that started it)."""
    measured = stdout.with_suffix(".rusage.json")
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", LAUNCHER, str(measured), str(stdout), *args], cwd=cwd, check=True)
    wall = time.monotonic() - start
    status, max_rss_kib = json.loads(measured.read_text())
    return status, wall, max_rss_kib / 1024  # ru_maxrss is in KiB on Linux


@pytest.fixture(scope="module")
def large_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    out = tmp_path_factory.mktemp("scale") / "run"
    return out, make_run(KERNELS, out)


@pytest.mark.skipif(not hasattr(os, "wait4"), reason="peak RSS of one child needs os.wait4 (POSIX)")
def test_assemble_of_100k_kernels_within_budget_and_complete(large_run):
    run, facts = large_run
    assert facts["kernels"] == KERNELS and facts["nvtx_ranges"] > 4 * KERNELS
    log, sqlite = run.parent / "assemble.log", run / "nsys" / "report.sqlite"
    yardstick = [sys.executable, "-c", YARDSTICK, str(sqlite)]
    before = run_measured(yardstick, REPO, run.parent / "yardstick.log")
    status, wall, rss = run_measured([sys.executable, "-m", "mcp_server.cli", "assemble", str(run)], REPO, log)
    after = run_measured(yardstick, REPO, run.parent / "yardstick.log")
    assert status == 0, log.read_text()[-2000:]
    assert before[0] == after[0] == 0
    budget = YARDSTICK_FACTOR * max(before[1], after[1])
    assert wall <= budget, (f"assemble of {KERNELS} kernels took {wall:.1f} s, over {YARDSTICK_FACTOR} times the "
                            f"yardstick's {before[1]:.1f} s and {after[1]:.1f} s")
    assert rss <= RSS_BUDGET_MIB, f"assemble of {KERNELS} kernels peaked at {rss:.0f} MiB (budget {RSS_BUDGET_MIB})"

    data = (run / "profile.json").read_bytes()
    kernel_ids = [int(m) for m in re.findall(rb'\n {5}"kernel_id": (\d+),', data)]
    assert sorted(kernel_ids) == list(range(KERNELS))  # every window kernel once, in an operator
    correlations = sorted(int(m) for m in re.findall(rb'\n {5}"correlation_id": (\d+),', data))
    with sqlite3.connect(run / "nsys" / "report.sqlite") as conn:
        raw = sorted(row[0] for row in conn.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL"))
    assert correlations == raw
    assert b'\n "unattributed_kernels": [],\n' in data
    assert re.search(rb'\n  "kernel_count": (\d+),', data).group(1) == str(KERNELS).encode()
    assert f"kernels: {KERNELS}, ".encode() in log.read_bytes()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small") / "run"
    make_run(3_000, out)
    return out


def test_records_built_without_validation_are_valid_and_equal_validated_ones(small_run, tmp_path):
    profile = assemble(RunDir(small_run))
    path = write_profile(tmp_path / "profile.json", profile)
    assert path.read_text(encoding="utf-8") == profile.model_dump_json(indent=1) + "\n"
    assert OperatorAttributedProfile.model_validate_json(path.read_bytes()) == profile
    for op in profile.operators[:500]:
        assert OperatorRecord.model_validate(op.model_dump()) == op
        assert op.model_fields_set == set(OperatorRecord.model_fields)
        assert op.aggregated.model_fields_set == {"kernel_count", "total_duration_ns", "dominant_kernel"}
        for kernel in op.kernels:
            assert KernelRecord.model_validate(kernel.model_dump()) == kernel
            assert kernel.model_fields_set == set(KernelRecord.model_fields)


def test_nvtx_table_out_of_start_order_reads_the_same(small_run, tmp_path):
    """nsys writes NVTX_EVENTS in start order and the reader streams it so; any other order is sorted, same result."""
    ordered = small_run / "nsys" / "report.sqlite"
    shuffled = tmp_path / "shuffled.sqlite"
    with sqlite3.connect(ordered) as src, sqlite3.connect(shuffled) as dst:
        src.backup(dst)
        rows = dst.execute("SELECT * FROM NVTX_EVENTS ORDER BY end DESC, rowid DESC").fetchall()
        dst.execute("DELETE FROM NVTX_EVENTS")
        dst.executemany(f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(rows[0]))})", rows)
    assert read_nsys_sqlite(shuffled) == read_nsys_sqlite(ordered)
