"""What ncu replays for a run: every distinct launch configuration, and each shape variant with what tells it
apart from the launch whose counters it would otherwise inherit; with --budget S, what the replay budget keeps of
the variants (`run --replay-budget`), less --warmup S of the shape-variant pass's own warm-up under ncu (which `run`
measures from its ncu pass). JSON on stdout.

    python scripts/replay_plan.py RUN_DIR [--budget 60 [--warmup 10]]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcp_server.capture.budget import budget_note, within_budget  # noqa: E402
from mcp_server.capture.replay_plan import plan_replays  # noqa: E402
from mcp_server.rundir import RunDir  # noqa: E402
from plugins.ncu.keys import ncu_config, operator_shapes  # noqa: E402
from plugins.nsys.reader import read_window  # noqa: E402


def _launches(sqlite: Path) -> list[dict[str, object]]:
    def collect(window: object) -> list[dict[str, object]]:
        rows = []
        for kernel in window.kernels():  # type: ignore[attr-defined]
            ops = [f.name for f in kernel.stack if f.kind == "op"]
            rows.append({"ordinal": kernel.ordinal, "name": kernel.name[:90], "mangled": kernel.mangled_name,
                         "key": repr(ncu_config(kernel)), "shapes": operator_shapes(kernel),
                         "op": ops[-1] if ops else None, "duration_ns": kernel.duration_ns})
        return rows

    return read_window(sqlite, collect)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--budget", type=float, help="seconds of replay to fit the plan to (run's --replay-budget)")
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds the shape-variant pass warms up under ncu, paid from the budget (default 0)")
    args = parser.parse_args()
    sqlite = RunDir(args.run_dir).nsys_sqlite()
    plan = plan_replays(sqlite)
    fitted = within_budget(plan, args.budget, plan.estimate_s(1), args.warmup) if args.budget else None
    launches = _launches(sqlite)
    first: dict[str, dict[str, object]] = {}
    invocation: Counter[str] = Counter()
    variants = []
    for row in launches:
        invocation[str(row["mangled"])] += 1
        row["invocation"] = invocation[str(row["mangled"])]
        base = first.setdefault(str(row["key"]), row)
        if row["ordinal"] in plan.variants:
            variants.append({**{k: row[k] for k in ("ordinal", "invocation", "name", "op", "shapes", "duration_ns")},
                             "first_of_config": base["ordinal"], "first_shapes": base["shapes"]})
    json.dump({"launches": plan.launches, "configurations": plan.configurations, "variants": len(plan.variants),
               "variant_names": len(plan.variant_names), "launch_skip": plan.launch_skip,
               "launch_count": plan.launch_count,
               "variant_kernel_time_ns": sum(int(v["duration_ns"]) for v in variants),  # type: ignore[call-overload]
               "by_name": Counter(str(v["name"])[:60] for v in variants).most_common(),
               "budget": None if fitted is None else {
                   "budget_s": fitted.budget_s, "warmup_s": fitted.start_s, "main_limit": fitted.main_limit,
                   "split": {"second_pass_kernels": fitted.variant_names, "unmeasured": fitted.unmeasured}
                   if fitted.config_pass else None,
                   "variants": len(fitted.variants),
                   "left_out": len(fitted.left_out), "replayed": len(fitted.replayed), "calls": fitted.calls,
                   "estimate_s": fitted.estimate_s(fitted.main_limit or fitted.configurations) + fitted.estimate_s(
                       len(fitted.replayed)),
                   "note": budget_note(fitted)},
               "detail": variants}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
