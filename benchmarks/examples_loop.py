"""The GPU stages of the optimization loop for example folders whose plan and optimized workload are written.

    python benchmarks/examples_loop.py NAME [NAME ...] --out DIR [--rounds N]

For each example (GPU machine, full size), in `examples/<name>/` as the optimize skill's loop writes them:
reprofile (`operator-profiler run --compile-mode optimized`, its profile.json copied to profile_optimized.json),
bench against eager as written (bench.json) and against the tier's
winner in the folder's recipes.json (bench_vs_free.json), then validate with the plan, the baseline's analysis and
bench.json. Each folder is packed into DIR/<name>.tar.xz (the runs themselves stay in a temporary folder);
a table of stage times and speedups is printed last.
`analyze` of the optimized profile, `compare` and `report` need no GPU: run them afterwards where the folders are
unpacked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from examples_frontier import bench_numbers, print_benches, run

REPO = Path(__file__).resolve().parents[1]


def example(name: str, out: Path, scratch: Path, rounds: int) -> dict[str, object]:
    """The loop's GPU stages of one example folder; the folder packed into out/<name>.tar.xz."""
    folder = REPO / "examples" / name
    base, opt = folder / f"{name}.py", folder / f"{name}_optimized.py"
    tier = json.loads((folder / "optimizations.json").read_text())["tier"]
    capture = json.loads((folder / "profile.json").read_text())["capture_metadata"]
    run_dir = scratch / f"{name}_optimized_run"
    times = {"reprofile_s": run(["run", str(opt), "--compile-mode", "optimized", "--warmup-iters",
                                 str(capture["warmup_iters"]), "--iters", str(capture["iters"]), "--seed",
                                 str(capture["seed"]), "--output", str(run_dir)])}
    shutil.copy(run_dir / "profile.json", folder / "profile_optimized.json")
    times["bench_s"] = run(["bench", str(base), str(opt), "--rounds", str(rounds), "--output", str(folder)])
    times["bench_free_s"] = run(["bench", str(base), str(opt), "--rounds", str(rounds), "--baseline-mode", "free",
                                 "--tier", tier,
                                 "--recipes", str(folder / "recipes.json"), "--output", str(folder)])
    times["validate_s"] = run(["validate", str(base), str(opt), "--tier", tier, "--optimizations",
                               str(folder / "optimizations.json"), "--analysis", str(folder / "analysis.json"),
                               "--bench", str(folder / "bench.json"), "--output", str(folder)])
    with tarfile.open(out / f"{name}.tar.xz", "w:xz") as tar:
        tar.add(folder, arcname=name)
    return {"example": name, "tier": tier, **times,
            "passed": json.loads((folder / "validation_report.json").read_text())["passed"], **bench_numbers(folder)}


def main() -> int:
    """Run the loop's GPU stages of each example named; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3, help="processes per side in each bench (default 3)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.names:
            rows.append(example(name, args.out, Path(scratch), args.rounds))
            (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        stages = ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in row.items() if k.endswith("_s"))
        print(f"{row['example']} ({row['tier']}; validation {'PASS' if row['passed'] else 'FAIL'}; {stages})")
        print_benches(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
