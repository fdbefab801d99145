"""Check the multi-rank path live on a GPU machine: `operator-profiler run --nproc-per-node N` on a workload,
then what its profiles and ranks.json say about the collectives, written as one JSON summary.

    python benchmarks/ranks_gpu_check.py --workload tests/workloads/ddp_mlp.py --nproc-per-node 1 --train-step \
        --run /tmp/ddp1 --summary "$OUT/ddp1.json" [--pack "$OUT/h100_ddp_one_rank.tar.xz"]
    python benchmarks/ranks_gpu_check.py --workload tests/scripts/spawn_train.py --script \
        --run /tmp/spawn --summary "$OUT/spawn.json" -- --ranks 2

A script (`--script`, its own arguments after `--`) may leave out `--nproc-per-node` when it starts its ranks with
torch.multiprocessing.spawn.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.assemble.collectives import kernel_collective  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402


def summarize(run: Path) -> dict[str, object]:
    """Per rank: kernel time attributed, NCCL kernels with their collective, module and counters."""
    ranks = json.loads((run / "ranks.json").read_text(encoding="utf-8"))
    out: dict[str, object] = {"ranks_json": ranks, "ranks": {}}
    for folder in sorted(run.glob("rank*/profile.json")):
        profile = load_profile(folder)
        kernels = [(k, op) for op in profile.operators for k in op.kernels]
        nccl = [(k, op) for k, op in kernels if kernel_collective(k.kernel_name)]
        total = sum(k.duration_ns for k, _ in kernels) + sum(k.duration_ns for k in profile.unattributed_kernels)
        compute = [k for k, _ in kernels if not kernel_collective(k.kernel_name)]
        info = profile.capture_metadata.distributed
        sited = sum(k.duration_ns for k, op in kernels if op.call_site)
        moduled = sum(k.duration_ns for k, op in kernels if op.module_path)
        counted = sum(k.duration_ns for k, _ in kernels if k.metrics)
        out["ranks"][folder.parent.name] = {  # type: ignore[index]
            "window": profile.window.model_dump(),
            "attributed_kernel_time_pct": 100.0 * sum(k.duration_ns for k, _ in kernels) / total if total else None,
            "call_site_kernel_time_pct": 100.0 * sited / total if total else None,
            "module_kernel_time_pct": 100.0 * moduled / total if total else None,
            "counter_kernel_time_pct": 100.0 * counted / total if total else None,
            "nccl_kernels": [{"name": k.kernel_name, "operator": op.operator_name, "collective": op.collective,
                              "seq": op.collective_seq, "module_path": op.module_path, "phase": op.phase,
                              "modules": op.collective_modules, "duration_ns": k.duration_ns,
                              "metrics": len(k.metrics)} for k, op in nccl],
            "unattributed_nccl": [k.kernel_name for k in profile.unattributed_kernels
                                  if kernel_collective(k.kernel_name)],
            "compute_kernels": len(compute),
            "compute_kernels_with_counters": sum(1 for k in compute if k.metrics),
            "distributed": info.model_dump(exclude={"topology"}) if info else None,
            "topology": info.topology if info else None,
            "warnings": profile.warnings,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, type=Path)
    parser.add_argument("--nproc-per-node", type=int)
    parser.add_argument("--script", action="store_true", help="run the workload as a plain script")
    parser.add_argument("script_args", nargs="*", help="the script's own arguments (after --)")
    parser.add_argument("--train-step", action="store_true")
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--summary", required=True, type=Path)
    parser.add_argument("--pack", type=Path, help="also pack the run directory (no .nsys-rep) as a fixture")
    parser.add_argument("--profile-only", action="store_true", help="no ncu pass (`profile` instead of `run`)")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "mcp_server.cli", "profile" if args.profile_only else "run", str(args.workload),
           "--output", str(args.run), "--quiet"]
    if args.nproc_per_node is not None:
        cmd += ["--nproc-per-node", str(args.nproc_per_node)]
    if args.train_step:
        cmd.append("--train-step")
    if args.script:
        cmd += ["--script", "--", *args.script_args]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    summary: dict[str, object] = {"command": cmd, "exit_code": done.returncode, "wall_s": round(wall, 1),
                                  "stdout_tail": done.stdout[-3000:], "stderr_tail": done.stderr[-3000:]}
    if done.returncode == 0:
        summary.update(summarize(args.run))
        if args.pack:
            with tarfile.open(args.pack, "w:xz") as tar:
                tar.add(args.run, arcname=args.run.name, filter=lambda t: None if t.name.endswith(".nsys-rep") else t)
            summary["fixture"] = str(args.pack)
    args.summary.write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    print(json.dumps({k: summary[k] for k in ("exit_code", "wall_s")}), done.stderr[-500:])


if __name__ == "__main__":
    main()
