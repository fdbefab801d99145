"""An optimized workload beyond the free frontier, measured against its tier's winner on this GPU.

    python benchmarks/beyond_check.py --out DIR [--tier exact|reduced|fp8] WORKLOAD.py:OPTIMIZED.py[:RECIPES.json] ...

For each pair: the free frontier of WORKLOAD (`operator-profiler recipes`, unless a recipes.json measured on this
GPU is named), the optimized workload benched against eager as written (bench.json) and against the tier's winner run
in its own processes (bench_vs_free.json), and validated at the tier (validation_report.json), all into
DIR/<optimized stem>/, packed as DIR/<optimized stem>.tar.xz. Writes DIR/beyond_check.json after every pair and
prints a table last. In the fp8 tier, which no free recipe computes in, the winner is the closest tier's that
validated. The loop's targets: validated and >= 0.98x the winner at the CI's lower bound; beyond it, >= 1.10x.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from examples_frontier import bench_numbers, frontier_and_benches, print_benches, run


def check(pair: str, tier: str, out: Path) -> dict[str, object]:
    """The frontier, the two benches and the validation of one WORKLOAD:OPTIMIZED[:RECIPES] pair."""
    base, opt, *recipes = (Path(p).resolve() for p in pair.split(":"))
    dest = out / opt.stem
    times = frontier_and_benches(base, opt, tier, dest, recipes[0] if recipes else None)
    times["validate_s"] = run(["validate", str(base), str(opt), "--tier", tier, "--bench", str(dest / "bench.json"),
                               "--output", str(dest)])
    with tarfile.open(out / f"{opt.stem}.tar.xz", "w:xz") as tar:
        tar.add(dest, arcname=opt.stem)
    verdict = json.loads((dest / "validation_report.json").read_text())
    device = json.loads((dest / "recipes.json").read_text()).get("device_name")
    return {"workload": str(base), "optimized": str(opt), "tier": tier, "device": device, **times,
            "passed": verdict["passed"], "max_rel_error": verdict.get("max_rel_error"), **bench_numbers(dest)}


def main() -> int:
    """Check each pair named; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="+", help="WORKLOAD.py:OPTIMIZED.py[:RECIPES.json]")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tier", choices=("exact", "reduced", "fp8"), default="reduced")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for pair in args.pairs:
        print(f"== {pair}", flush=True)
        try:
            rows.append(check(pair, args.tier, args.out))
        except Exception as exc:  # one pair failing leaves the others measured
            rows.append({"pair": pair, "error": repr(exc)})
        (args.out / "beyond_check.json").write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        if "error" in row:
            print(f"{row['pair']}: {row['error']}")
            continue
        stages = ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in row.items() if k.endswith("_s") and v)
        print(f"{Path(str(row['optimized'])).name} ({row['tier']}; winner {row['winner']}; validation "
              f"{'PASS' if row['passed'] else 'FAIL'}; {stages})")
        print_benches(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
