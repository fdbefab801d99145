"""Measure the pipeline's targets on a GPU machine: end-to-end `run` wall time, attribution coverage,
counter coverage, and per-operator time against the window's GPU busy time measured without any profiler.

    python scripts/benchmark_targets.py --out "$OUT" [--workloads conv_block,gpt2] [--modes eager,inductor]
    python scripts/benchmark_targets.py --out "$OUT" --modes inductor \
        --workloads scripts/gpu_workloads/resnet50.py,scripts/gpu_workloads/encoder_train_step.py+train

A workload is an example's name or a .py file's path; `+train` profiles its `train_step` (--train-step).

For each workload and mode: (1) two harness passes with no profiler measure the window's GPU busy time: in
the first, the GPU spins (`torch.cuda._sleep`) while the host enqueues the whole window, then two CUDA events
time its work back to back, with none of the host's launch gaps (`queued_ahead` says the host finished
enqueueing before the spin ended); in the second, one iteration captured in a CUDA graph is replayed, so the
events also lose most of the GPU's own gap between back-to-back launches (`graph_replay_gpu_busy_ns`);
(2) `operator-profiler run` is timed as a user runs it, as a child process, with the phases of each pass
(`pass_phases`, seconds from its start); (3) its profile.json gives coverage and the sum of per-operator
durations. Prints a table; writes targets_<modes>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.capture.passes import run_pass  # noqa: E402
from mcp_server.capture.request import CaptureRequest  # noqa: E402
from mcp_server.rundir import RunDir  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402

ALL = ",".join([
    "conv_block", "gpt2", "embedding_projection", "mlp_activations", "sdpa_attention", "depthwise_separable_conv",
    "lstm_sequence_encoder",
])


def measure(entry: str, mode: str, work: Path) -> dict[str, object]:
    """One row of the targets table."""
    spec, _, flag = entry.partition("+")
    path = REPO / spec if spec.endswith(".py") else REPO / "examples" / spec / f"{spec}.py"
    workload, train = path.stem, flag == "train"
    row: dict[str, object] = {"workload": workload + ("+train" if train else ""), "mode": mode}
    timing_dir = work / f"{workload}_{mode}_timing"
    request = CaptureRequest(workload=path, run_dir=RunDir(timing_dir), compile_mode=mode, queue_ahead=True,
                             train_step=train)
    _, result = run_pass(request, "timing", "none")
    row["no_profiler_gpu_busy_ns"] = result["window"].get("gpu_elapsed_ns")
    marks = result.get("phase_started_at", {})
    row["no_profiler_phases"] = {name: round(t - min(marks.values()), 2) for name, t in marks.items()}
    row["queued_ahead"] = result["window"].get("queued_ahead")
    graph = replace(request, run_dir=RunDir(work / f"{workload}_{mode}_graph"), graph_replay=True)
    _, result = run_pass(graph, "timing", "none")
    if result["window"].get("graph_replay"):
        row["graph_replay_gpu_busy_ns"] = result["window"].get("gpu_elapsed_ns")
    else:
        row["graph_replay_error"] = result["warnings"][-1] if result["warnings"] else "not captured"
    run_dir = work / f"{workload}_{mode}"
    t0, t0_epoch = time.monotonic(), time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "run", str(path), "--compile-mode", mode, "-o", str(run_dir), "-q",
         *(["--train-step"] if train else [])],
        capture_output=True, text=True, check=False,
    )
    row["run_wall_s"] = round(time.monotonic() - t0, 1)
    if proc.returncode != 0:
        row["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        return row
    profile = load_profile(run_dir / "profile.json")
    manifest_passes = json.loads((run_dir / "manifest.json").read_text())["passes"]
    win = profile.window
    op_time = sum(op.aggregated.total_duration_ns for op in profile.operators)
    row.update(
        kernels=win.kernel_count,
        attributed_pct=round(win.attributed_kernel_time_pct or 0.0, 3),
        kernels_with_counters=win.kernels_with_counters,
        operator_time_ns=op_time,
        gpu_busy_ns=win.gpu_busy_time_ns,
        profiled_gpu_elapsed_ns=win.gpu_elapsed_ns,
        warnings=profile.warnings,
        passes={p["name"]: p["wall_time_s"] for p in manifest_passes},
        variant_pass_attached=any(p.get("attach_command") for p in manifest_passes),
        pass_phases=_pass_phases(run_dir, t0_epoch),
    )
    busy = row["no_profiler_gpu_busy_ns"]
    if busy:
        row["operator_time_vs_unprofiled_pct"] = round(100.0 * (op_time - busy) / busy, 2)
    graph_busy = row.get("graph_replay_gpu_busy_ns")
    if graph_busy:
        row["operator_time_vs_graph_replay_pct"] = round(100.0 * (op_time - graph_busy) / graph_busy, 2)
    return row


def _pass_phases(run_dir: Path, t0_epoch: float) -> dict[str, dict[str, float]]:
    """Seconds from the start of `run` at which each pass's harness entered each phase, and finished."""
    phases: dict[str, dict[str, float]] = {}
    for harness in sorted(run_dir.glob("*/harness.json")):
        result = json.loads(harness.read_text())
        marks = {name: round(t - t0_epoch, 2) for name, t in result.get("phase_started_at", {}).items()}
        for key in ("profiler_start_ns", "profiler_stop_ns"):
            if result.get("window", {}).get(key) is not None:
                marks[key.removesuffix("_ns") + "_s"] = round(result["window"][key] / 1e9, 2)
        phases[harness.parent.name] = marks
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/op_targets"))
    parser.add_argument("--workloads", default=ALL)
    parser.add_argument("--modes", default="eager,inductor")
    parser.add_argument("--pack", action="append", default=[],
                        help="also bring back <workload>_<mode>'s run directory as a tar.xz in --out (repeatable)")
    args = parser.parse_args()
    os.environ.setdefault("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")
    shutil.rmtree(args.work, ignore_errors=True)
    rows = []
    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            row = measure(workload, mode, args.work)
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_".join(args.modes.split(","))
    (args.out / f"targets_{suffix}.json").write_text(json.dumps(rows, indent=1))
    for name in args.pack:
        for rep in (args.work / name).glob("*/report.nsys-rep"):
            rep.unlink()
        subprocess.run(["tar", "-cJf", str(args.out / f"{name}.tar.xz"), "-C", str(args.work), name],
                       check=True, env={**os.environ, "XZ_OPT": "-6"})
    print(f"\n{'workload':26s} {'mode':9s} {'run s':>6s} {'kernels':>7s} {'attrib %':>8s} {'counters':>8s} "
          f"{'op time us':>10s} {'busy us':>10s} {'diff %':>7s} {'graph us':>9s} {'diff %':>7s} queued")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:26s} {r['mode']:9s} {r['run_wall_s']:6.1f} ERROR {r['error']}")
            continue
        unprof = (r["no_profiler_gpu_busy_ns"] or 0) / 1e3
        print(f"{r['workload']:26s} {r['mode']:9s} {r['run_wall_s']:6.1f} {r['kernels']:7d} {r['attributed_pct']:8.2f} "
              f"{r['kernels_with_counters']:8d} {r['operator_time_ns'] / 1e3:10.1f} {unprof:10.1f} "
              f"{r.get('operator_time_vs_unprofiled_pct', float('nan')):7.2f} "
              f"{(r.get('graph_replay_gpu_busy_ns') or 0) / 1e3:9.1f} "
              f"{r.get('operator_time_vs_graph_replay_pct', float('nan')):7.2f} {r.get('queued_ahead')}")


if __name__ == "__main__":
    main()
