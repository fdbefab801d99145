"""`operator-profiler optimize` on workloads not in examples/, as a user runs it: what the floor gives on this GPU.

    python benchmarks/optimize_check.py --out DIR [--tier reduced] WORKLOAD.py [WORKLOAD.py ...]

Each workload is optimized in a child process (`operator-profiler optimize W --tier T --output DIR/<name>`); the row
keeps the command's wall time, the tier's winner from recipes.json, the optimized workload's isolated bench against
eager (bench.json) and against the winner run in its own processes (bench_vs_free.json), and validate's verdict and
largest relative error. Writes DIR/optimize_check.json after every workload, packs each output folder (without its
runs/ and recipe scratch) as DIR/<name>_optimize.tar.xz, and prints a table last. The issue's target for the floor:
the optimized workload validated and >= 0.98x the winner of its tier (CI lower bound).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def speedup(bench: dict[str, Any]) -> dict[str, Any]:
    """The headline speedup of one bench file, with its CI and the two sides' medians in microseconds."""
    key = "back_to_back" if bench["headline"] == "back_to_back" else "latency"
    ratio = bench[f"{key}_speedup"]
    return {"metric": key, "point": round(ratio["point"], 3), "ci": [round(ratio["ci_low"], 3),
                                                                      round(ratio["ci_high"], 3)],
            "baseline_us": round(bench["baseline"][key]["median_ns"] / 1e3, 1),
            "optimized_us": round(bench["optimized"][key]["median_ns"] / 1e3, 1)}


def optimize(workload: Path, tier: str, out: Path, timeout: float) -> dict[str, Any]:
    """Run optimize on one workload; the numbers its folder holds."""
    folder = out / workload.stem
    command = [sys.executable, "-m", "mcp_server.cli", "optimize", str(workload), "--tier", tier, "--output",
               str(folder), "-q"]
    row: dict[str, Any] = {"workload": str(workload.relative_to(REPO) if workload.is_relative_to(REPO) else workload),
                           "tier": tier}
    t0 = time.monotonic()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {**row, "error": f"timed out after {timeout:.0f} s"}
    row["wall_s"] = round(time.monotonic() - t0, 1)
    row["exit_code"] = proc.returncode
    row["summary"] = proc.stdout.strip().splitlines()[-1:] or proc.stderr.strip().splitlines()[-3:]
    if not (folder / "bench.json").exists():
        return {**row, "error": "\n".join(proc.stderr.splitlines()[-15:])}
    recipes = json.loads((folder / "recipes.json").read_text())
    row["device"] = recipes.get("device_name")
    row["recipes_wall_s"] = recipes.get("wall_time_s")
    row["winner"] = next((w for w in recipes["winners"] if w["tier"] == tier and w["metric"] == "latency"), None)
    row["vs_eager"] = speedup(json.loads((folder / "bench.json").read_text()))
    row["vs_winner"] = speedup(json.loads((folder / "bench_vs_free.json").read_text()))
    report = json.loads((folder / "validation_report.json").read_text())
    row["validated"] = report["passed"]
    row["max_rel_error"] = report["max_rel_error"]
    row["floor_target_met"] = bool(report["passed"]) and row["vs_winner"]["ci"][0] >= 0.98
    subprocess.run(["tar", "-cJf", str(out / f"{workload.stem}_optimize.tar.xz"), "--exclude", "runs",
                    "-C", str(out), workload.stem], check=True, env={**os.environ, "XZ_OPT": "-9"})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tier", choices=("exact", "reduced"), default="reduced")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each optimize may take")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads:
        print(f"== {workload}", flush=True)
        rows.append(optimize(workload.resolve(), args.tier, args.out, args.timeout))
        (args.out / "optimize_check.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
    print(f"\n{'workload':28s} {'s':>6s} {'winner':34s} {'vs eager':>16s} {'vs winner (CI)':>22s} valid")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:28s} error: {r['error'][-200:]}")
            continue
        eager, winner = r["vs_eager"], r["vs_winner"]
        print(f"{r['workload']:28s} {r['wall_s']:6.0f} {(r['winner'] or {}).get('recipe', '-'):34s} "
              f"{eager['point']:7.3f}x {eager['optimized_us']:7.1f}us {winner['point']:6.3f}x "
              f"({winner['ci'][0]:.3f}-{winner['ci'][1]:.3f}) {r['validated']}")


if __name__ == "__main__":
    main()
