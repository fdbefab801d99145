"""The calibration table: each workload's window measured without the profiler, its verdict and top estimates,
beside the speedups `bench` measured when each change was applied alone. Runs anywhere (no GPU).

    python benchmarks/calibration_table.py --profiles tests/fixtures/h100_timing_profiles \
        --measured docs/measurements/h100_calibration_examples_bench.json \
        --measured docs/measurements/h100_calibration_own_bench.json \
        --out docs/measurements/h100_calibration.json

Each profile (`<workload>_eager.json` or `.json.xz`, recorded on the GPU machine by
`benchmarks/benchmark_targets.py --profiles`) is analysed with the current analysis; each of its top opportunities
is paired with the measured row of the same workload and change class (`benchmarks/calibrate_estimates.py`'s
calibration.json; a later file wins). An estimate is an upper bound: the window over the window less the estimated
saving bounds the speedup. Bench times its own eager baseline (back-to-back calls), which need not equal the timing
pass's window, so speedups are compared, not milliseconds: a measured speedup above the estimated one, or above the
window's plausible speed-of-light ceiling, is flagged. Writes the rows as JSON
and prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.analysis import analyze_profile  # noqa: E402
from mcp_server.schema.analysis import Analysis  # noqa: E402
from mcp_server.schema.io import load_profile, write_text_atomic  # noqa: E402
from mcp_server.schema.profile import OperatorAttributedProfile  # noqa: E402

TOP = 3


def _load(path: Path) -> OperatorAttributedProfile:
    if path.suffix != ".xz":
        return load_profile(path)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / path.stem
        plain.write_bytes(lzma.decompress(path.read_bytes()))
        return load_profile(plain)


def _measured(files: list[Path]) -> dict[tuple[str, str], dict[str, object]]:
    rows: dict[tuple[str, str], dict[str, object]] = {}
    for file in files:
        for row in json.loads(file.read_text()):
            if "change_class" in row and "measured_speedup" in row:
                rows[(str(row["workload"]), str(row["change_class"]))] = row
    return rows


def analyse(profile_path: Path) -> tuple[str, Analysis]:
    """The workload's name (the file's, less `_eager`) and the current analysis of its recorded profile."""
    workload = profile_path.name.split(".")[0].removesuffix("_eager")
    with tempfile.TemporaryDirectory() as tmp:
        return workload, analyze_profile(_load(profile_path), Path(tmp))


def rows_of(workload: str, analysis: Analysis, measured: dict[tuple[str, str], dict[str, object]]
            ) -> list[dict[str, object]]:
    """One row per top opportunity of the analysis (one row when it has none)."""
    timeline = analysis.timeline
    assert timeline is not None, f"{workload}: no timeline"
    sol = analysis.speed_of_light
    base: dict[str, object] = {
        "workload": workload, "window_ns": timeline.window_ns, "window_source": timeline.window_source,
        "gpu_busy_pct": round(timeline.gpu_utilization_pct, 1), "verdict": analysis.diagnosis.bottleneck.value,
        "root_cause": analysis.diagnosis.root_cause,
        "max_plausible_speedup": sol.max_plausible_speedup if sol is not None else None,
    }
    out: list[dict[str, object]] = []
    for opportunity in analysis.opportunities[:TOP] or [None]:
        row = dict(base)
        out.append(row)
        if opportunity is None:
            continue
        saving = opportunity.estimated_saving_ns
        row.update(rank=opportunity.rank, opportunity=opportunity.title, change_class=opportunity.change_class,
                   estimated_saving_ns=saving,
                   estimated_speedup=round(timeline.window_ns / max(timeline.window_ns - saving, 1), 3))
        bench = measured.get((workload, opportunity.change_class))
        if bench is None:
            continue
        ceiling = row["max_plausible_speedup"]
        speedup = float(bench["measured_speedup"])  # type: ignore[arg-type]
        measured_ns = int(bench["measured_saving_ns"])  # type: ignore[call-overload]
        row.update(measured_speedup=speedup, measured_ci=bench.get("measured_ci"),
                   measured_saving_ns=measured_ns, bench_baseline_median_ns=bench.get("baseline_median_ns"),
                   applied_as=bench.get("recipe"), rewrites=bench.get("rewrites"),
                   estimate_holds=speedup <= float(row["estimated_speedup"]),  # type: ignore[arg-type]
                   saving_within_estimate=measured_ns <= saving,
                   within_ceiling=ceiling is None or speedup <= float(ceiling))  # type: ignore[arg-type]
    return out


def table(rows: list[dict[str, object]]) -> str:
    """The markdown table of the rows."""
    lines = ["| workload | window, no profiler | GPU busy | verdict | SOL ceiling | # | top estimate (class) | "
             "measured after applying it alone (bench vs eager) | estimate holds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ceiling = f"{r['max_plausible_speedup']:.2f}×" if r["max_plausible_speedup"] else "–"
        head = (f"| {r['workload']} | {int(r['window_ns']) / 1e6:.3f} ms | {r['gpu_busy_pct']} % | "  # type: ignore[call-overload]
                f"{r['verdict']} | {ceiling} | ")
        if "rank" not in r:
            lines.append(head + "– | no opportunity | – | – |")
            continue
        estimate = (f"{r['opportunity']} ({r['change_class']}): ≤ {int(r['estimated_saving_ns']) / 1e6:.3f} ms "  # type: ignore[call-overload]
                    f"(≤ {r['estimated_speedup']}×)")
        if "measured_speedup" in r:
            ci = r.get("measured_ci") or ["?", "?"]
            rewrites = f"; {r['rewrites']} rewrites" if r.get("rewrites") is not None else ""
            measured = (f"{int(r['measured_saving_ns']) / 1e6:.3f} ms ({r['measured_speedup']}×, 95 % CI "  # type: ignore[call-overload]
                        f"{ci[0]}–{ci[1]}; eager {float(r['bench_baseline_median_ns']) / 1e6:.3f} ms{rewrites})")  # type: ignore[arg-type,index]
            holds = ("yes" if r["estimate_holds"] else "**no: measured faster**") + (
                "" if r["within_ceiling"] else "; **above the SOL ceiling**")
        else:
            measured, holds = "not applied alone", "–"
        lines.append(head + f"{r['rank']} | {estimate} | {measured} | {holds} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", required=True, type=Path, help="folder of <workload>_eager.json[.xz] profiles")
    parser.add_argument("--measured", action="append", default=[], type=Path,
                        help="a calibration.json of benchmarks/calibrate_estimates.py (repeatable; a later file wins)")
    parser.add_argument("--out", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    measured = _measured(args.measured)
    rows = [r for path in sorted(args.profiles.glob("*_eager.json*")) for r in rows_of(*analyse(path), measured)]
    if args.out is not None:
        write_text_atomic(args.out, json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
