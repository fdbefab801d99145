"""The floor's bench, timed in turns and one process at a time: a recipe against the same recipe as a workload.

    python benchmarks/floor_in_turns.py --out DIR [--summary JSON] [--keep DIR] [--repeats 1] [--tier reduced]
        [--ways in_turns,one_at_a_time] [--outputs clone,as_is] [--rounds 3] W.py=RECIPE [...]

For each workload: `operator-profiler recipes W --only RECIPE --seeds 0` measures that recipe on this GPU; the
optimized workload `optimize` would write for it (`render/recipe_workload.py`) is written beside recipes.json; then
`operator-profiler bench W W_optimized.py --baseline-mode free` runs `--repeats` times in each of its two ways, in
turns (`--interleave`) and one process at a time (the default), alternating. Both sides run the same code, so the
speedup is 1.0 up to the clone of each output the workload adds; what differs between the two ways is how far the
host's speed, which moves between and within processes, widens the interval. Writes the summary (default
DIR/floor_in_turns.json) after every bench and prints a table last (the floor's target: the CI's lower bound >=
0.98). With --keep, each bench file is copied there as <workload>_bench_<way>_<repeat>.json
(`tests/fixtures/h200_bench_*.json.xz`). `--outputs as_is` also benches a copy of the workload that returns the
CUDA-graph replay's outputs uncloned, as the recipe does (it fails validate's output_caching check): the clone's
share of the gap, measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.proof.bench import load_recipes  # noqa: E402
from mcp_server.render.recipe_workload import write_recipe_workload  # noqa: E402


def cli(*args: str, timeout: float) -> tuple[int, float, str]:
    """Run the product's CLI; its exit code, wall time and last lines."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", *args, "-q"], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    return proc.returncode, round(time.monotonic() - t0, 1), tail


def side_medians(side: dict[str, Any], metric: str) -> list[float]:
    """Each process's median of `metric`, in microseconds."""
    key = "latency_ns" if metric == "latency" else "back_to_back_ns"
    return [round(statistics.median(m[key]) / 1e3, 1) for m in side["rounds"]]


def bench_row(path: Path) -> dict[str, Any]:
    """What one bench file says: both metrics' ratio and CI, each side's per-process medians."""
    bench = json.loads(path.read_text())
    row: dict[str, Any] = {"interleaved": bench.get("interleaved", False), "wall_s": bench["wall_time_s"]}
    for metric in ("latency", "back_to_back"):
        s = bench[f"{metric}_speedup"]
        row[metric] = {"point": round(s["point"], 4), "ci": [round(s["ci_low"], 4), round(s["ci_high"], 4)],
                       "ci_width": round(s["ci_high"] - s["ci_low"], 4),
                       "baseline_us": side_medians(bench["baseline"], metric),
                       "optimized_us": side_medians(bench["optimized"], metric)}
    return row


def uncloned(optimized: Path) -> Path:
    """A copy of `optimized` returning the replay's outputs as the recipe does, without the clone `optimize` adds."""
    lines = optimized.read_text().splitlines()
    kept = [line[:len(line) - len(line.lstrip())] + "return out"
            if line.strip().startswith("return tree_map(lambda t: t.clone()") else line for line in lines]
    copy = optimized.with_name(optimized.stem + "_as_is.py")
    copy.write_text("\n".join(kept) + "\n")
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--summary", type=Path)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--tier", default="reduced")
    parser.add_argument("--ways", default="in_turns,one_at_a_time", help="which of the two ways, in this order")
    parser.add_argument("--outputs", default="clone", help="clone (as optimize writes it) and/or as_is, in order")
    parser.add_argument("--rounds", type=int, default=3, help="bench's processes per side")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("pairs", nargs="+", metavar="WORKLOAD.py=RECIPE")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    summary_path = args.summary or args.out / "floor_in_turns.json"
    summary: dict[str, Any] = {"rows": []}
    for pair in args.pairs:
        workload_text, recipe = pair.split("=", 1)
        workload = Path(workload_text).resolve()
        folder = args.out / workload.stem
        row: dict[str, Any] = {"workload": str(workload.relative_to(REPO)), "recipe": recipe, "benches": []}
        summary["rows"].append(row)
        code, wall, tail = cli("recipes", str(workload), "--only", recipe, "--seeds", "0", "--output", str(folder),
                               timeout=args.timeout)
        row["recipes_s"] = wall
        if code != 0:
            row["error"] = tail
            continue
        report = load_recipes(folder / "recipes.json")
        winner = report.winner(args.tier, "latency")
        if winner is None:
            row["error"] = f"{recipe} is no winner of the {args.tier} tier: {tail}"
            continue
        row["device"] = report.device_name
        written = write_recipe_workload(workload, winner, report, folder / "recipes.json", folder)
        variants = {"clone": written, "as_is": uncloned(written)}
        for k in range(args.repeats):
            for way in args.ways.split(","):
                for outputs in args.outputs.split(","):
                    tag = f"{way}_{outputs}_{k + 1}"
                    out = folder / f"bench_{tag}"
                    flags = ["--interleave"] if way == "in_turns" else []
                    code, wall, tail = cli("bench", str(workload), str(variants[outputs]), "--baseline-mode", "free",
                                           "--tier", args.tier, "--recipes", str(folder / "recipes.json"),
                                           "--rounds", str(args.rounds), "--output", str(out), *flags,
                                           timeout=args.timeout)
                    result = out / "bench_vs_free.json"
                    if args.keep is not None and result.is_file():
                        args.keep.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(result, args.keep / f"{workload.stem}_bench_{tag}.json")
                    row["benches"].append({"way": way, "outputs": outputs, "repeat": k + 1, "command_s": wall,
                                           **(bench_row(result) if code == 0 and result.is_file()
                                              else {"error": tail})})
                    summary_path.write_text(json.dumps(summary, indent=1))
    print("| workload | recipe | way | outputs | latency (95 % CI) | width | back-to-back (95 % CI) | width | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in summary["rows"]:
        name = Path(row["workload"]).stem
        for b in row["benches"] or [{"way": "-", "error": row.get("error", "")}]:
            if "error" in b:
                print(f"| {name} | {row['recipe']} | {b['way']} | {b.get('outputs', '-')} | error: "
                      f"{b['error'].splitlines()[-1:] if b['error'] else ''} |")
                continue
            lat, b2b = b["latency"], b["back_to_back"]
            print(f"| {name} | {row['recipe']} | {b['way']} | {b['outputs']} | {lat['point']:.3f} "
                  f"({lat['ci'][0]:.3f}–{lat['ci'][1]:.3f}) | {lat['ci_width']:.3f} | {b2b['point']:.3f} "
                  f"({b2b['ci'][0]:.3f}–{b2b['ci'][1]:.3f}) | {b2b['ci_width']:.3f} | {b['command_s']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
