"""The free frontier of each example, and its committed optimized workload benched against eager and the winner.

    python benchmarks/examples_frontier.py NAME [NAME ...] --out DIR [--reuse-recipes DIR]

For each example (GPU machine, full size): `operator-profiler recipes` (recipes.json, frontier.png), then
`operator-profiler bench` of `<name>_optimized.py` against eager as written (bench.json) and against the winner of
the tier its optimizations.json names (bench_vs_free.json), each side in its own processes. Everything lands in
DIR/<name>/; a table of the numbers is printed last. `--reuse-recipes` takes DIR/<name>/recipes.json measured
earlier on the same GPU instead of measuring it again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.schema.recipes import RecipesReport  # noqa: E402


def run(argv: list[str]) -> float:
    """Run one CLI command, quietly; its wall time in seconds."""
    t0 = time.monotonic()
    subprocess.run(["operator-profiler", *argv, "--quiet"], check=True)
    return time.monotonic() - t0


def frontier_and_benches(base: Path, opt: Path, tier: str, dest: Path, recipes: Path | None) -> dict[str, object]:
    """Into `dest`: the free frontier of `base` (`recipes`, or a copy of the recipes.json named, with its
    frontier.png when there is one), `opt` benched against eager (bench.json) and against the tier's winner
    (bench_vs_free.json); the stages' wall times in seconds and the winner's recipe."""
    dest.mkdir(parents=True, exist_ok=True)
    recipes_s = None
    if recipes is not None:
        shutil.copy(recipes, dest / "recipes.json")
        if recipes.with_name("frontier.png").is_file():
            shutil.copy(recipes.with_name("frontier.png"), dest / "frontier.png")
    else:
        recipes_s = run(["recipes", str(base), "--output", str(dest)])
    eager_s = run(["bench", str(base), str(opt), "--output", str(dest)])
    free_s = run(["bench", str(base), str(opt), "--baseline-mode", "free", "--tier", tier, "--recipes",
                  str(dest / "recipes.json"), "--output", str(dest)])
    winner = RecipesReport.model_validate_json((dest / "recipes.json").read_text()).winner(tier)
    if winner is None:
        raise ValueError(f"no recipe of the {tier} tier, or a tighter one, validated: nothing to bench against")
    return {"winner": winner.recipe, "winner_recipes_us": winner.time_ns / 1e3, "recipes_s": recipes_s,
            "bench_s": eager_s, "bench_free_s": free_s}


def example(name: str, out: Path, reuse: Path | None) -> dict[str, object]:
    """Recipes and the two benches of one example into out/<name>/."""
    folder = REPO / "examples" / name
    tier = json.loads((folder / "optimizations.json").read_text())["tier"]
    reused = reuse / name / "recipes.json" if reuse is not None else None
    times = frontier_and_benches(folder / f"{name}.py", folder / f"{name}_optimized.py", tier, out / name,
                                 reused if reused is not None and reused.is_file() else None)
    return {"example": name, "tier": tier, **times, **bench_numbers(out / name)}


def bench_numbers(folder: Path) -> dict[str, object]:
    """Per bench file of `folder` (bench.json: eager; bench_vs_free.json: free) and metric: baseline and optimized
    medians (us), the speedup and its 95 % CI."""
    row: dict[str, object] = {}
    for label, file in (("eager", "bench.json"), ("free", "bench_vs_free.json")):
        bench = json.loads((folder / file).read_text())
        for metric in ("latency", "back_to_back"):
            s = bench[f"{metric}_speedup"]
            row[f"{label}_{metric}"] = (bench["baseline"][metric]["median_ns"] / 1e3,
                                        bench["optimized"][metric]["median_ns"] / 1e3, s["point"], s["ci_low"],
                                        s["ci_high"])
    return row


def print_benches(row: dict[str, object]) -> None:
    """The rows `bench_numbers` made, one line per bench and metric."""
    for label in ("eager", "free"):
        for metric in ("latency", "back_to_back"):
            b, o, point, low, high = row[f"{label}_{metric}"]  # type: ignore[misc]
            print(f"  vs {label:5s} {metric:12s} baseline {b:9.1f} us  optimized {o:9.1f} us  "
                  f"{point:.3f}x ({low:.3f}-{high:.3f})")


def main() -> int:
    """Measure each example named; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reuse-recipes", type=Path)
    args = parser.parse_args()
    rows = [example(name, args.out, args.reuse_recipes) for name in args.names]
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        print(f"{row['example']} ({row['tier']}; winner {row['winner']}; recipes {row['recipes_s']} s)")
        print_benches(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
