"""Run `operator-profiler run` on the attribution checks (GPU machine) and print what each profile attributes.

    python benchmarks/attribution_check.py --out "$OUT"   # full-size training step (eager, inductor), graph breaks

Per run: wall time of the command, kernel-time shares with an operator, a module path and a call site, kernel
time by phase, backward kernel time with a module path, and the graph breaks with their lines. The profiles are
copied to --out as <name>.profile.json.
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
CHECKS = (
    ("encoder_train_eager", "scripts/gpu_workloads/encoder_train_step.py", ["--train-step"]),
    ("encoder_train_inductor", "scripts/gpu_workloads/encoder_train_step.py",
     ["--train-step", "--compile-mode", "inductor"]),
    ("graph_breaks_inductor", "scripts/gpu_workloads/graph_breaks.py", ["--compile-mode", "inductor"]),
)


def shares(profile: dict) -> dict[str, object]:
    """What the profile attributes, from its operators (computed here, not read from its window totals)."""
    total = module = site = backward = backward_module = 0
    phases: dict[str, int] = {}
    for op in profile["operators"]:
        ns = sum(k["duration_ns"] for k in op["kernels"])
        total += ns
        module += ns if op.get("module_path") else 0
        site += ns if op.get("call_site") else 0
        phases[op.get("phase") or "-"] = phases.get(op.get("phase") or "-", 0) + ns
        if op.get("phase") == "backward":
            backward += ns
            backward_module += ns if op.get("module_path") else 0
    total += sum(k["duration_ns"] for k in profile["unattributed_kernels"])
    pct = lambda part, whole: round(100.0 * part / whole, 2) if whole else None  # noqa: E731
    return {"attributed_pct": profile["window"]["attributed_kernel_time_pct"], "module_pct": pct(module, total),
            "call_site_pct": pct(site, total), "backward_module_pct": pct(backward_module, backward),
            "phases_us": {k: round(v / 1e3, 1) for k, v in phases.items()},
            "graph_breaks": profile["capture_metadata"].get("graph_breaks")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/op_attribution"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name, workload, flags in CHECKS:
        run_dir = args.work / name
        command = [sys.executable, "-m", "mcp_server.cli", "run", workload, "--output", str(run_dir), *flags]
        t0 = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=570)
        seconds = round(time.monotonic() - t0, 1)
        if done.returncode != 0:
            print(f"!! {name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}", flush=True)
            continue
        profile = json.loads((run_dir / "profile.json").read_text())
        shutil.copyfile(run_dir / "profile.json", args.out / f"{name}.profile.json")
        rows[name] = {"run_s": seconds, **shares(profile)}
        print(name, json.dumps(rows[name], indent=1), flush=True)
    (args.out / "attribution_check.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
