"""Measure the pipeline's targets on a GPU machine: end-to-end `run` wall time, attribution coverage,
counter coverage, and per-operator time against the window's GPU busy time measured without any profiler.

    python benchmarks/benchmark_targets.py --out "$OUT" [--workloads conv_block,gpt2] [--modes eager,inductor]
    python benchmarks/benchmark_targets.py --out "$OUT" --modes inductor \
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

from mcp_server.analysis import analyze_profile  # noqa: E402
from mcp_server.capture.passes import run_pass  # noqa: E402
from mcp_server.capture.request import CaptureRequest, GpuTurn, WorkloadOptions  # noqa: E402
from mcp_server.rundir import RunDir  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402

ALL = ",".join([
    "conv_block", "gpt2", "embedding_projection", "mlp_activations", "sdpa_attention", "depthwise_separable_conv",
    "lstm_sequence_encoder",
])


def measure(entry: str, mode: str, work: Path, references: bool = True) -> dict[str, object]:
    """One row of the targets table."""
    spec, _, flag = entry.partition("+")
    path = REPO / spec if spec.endswith(".py") else REPO / "examples" / spec / f"{spec}.py"
    workload, train = path.stem, flag == "train"
    row: dict[str, object] = {"workload": workload + ("+train" if train else ""), "mode": mode}
    if references:
        _references(row, path, workload, mode, train, work)
    return _run(row, path, workload, mode, train, work)


def _references(row: dict[str, object], path: Path, workload: str, mode: str, train: bool, work: Path) -> None:
    """Two no-profiler references of the window's busy time: queued ahead, and replayed from a CUDA graph."""
    timing_dir = work / f"{workload}_{mode}_timing"
    request = CaptureRequest(workload=path, run_dir=RunDir(timing_dir),
                             options=WorkloadOptions(compile_mode=mode, train_step=train),  # type: ignore[arg-type]
                             turn=GpuTurn(queue_ahead=True))
    _, result = run_pass(request, "timing", "none")
    assert result is not None
    window = result.the_window
    row["no_profiler_gpu_busy_ns"] = window.gpu_elapsed_ns
    marks: dict[str, float] = getattr(result, "phase_started_at", None) or {}
    row["no_profiler_phases"] = {name: round(t - min(marks.values()), 2) for name, t in marks.items()}
    row["queued_ahead"] = window.queued_ahead
    graph = replace(request, run_dir=RunDir(work / f"{workload}_{mode}_graph"), turn=GpuTurn(graph_replay=True))
    _, result = run_pass(graph, "timing", "none")
    assert result is not None
    if result.the_window.graph_replay:
        row["graph_replay_gpu_busy_ns"] = result.the_window.gpu_elapsed_ns
    else:
        row["graph_replay_error"] = result.warnings[-1] if result.warnings else "not captured"


def _run(row: dict[str, object], path: Path, workload: str, mode: str, train: bool, work: Path) -> dict[str, object]:
    """`operator-profiler run` as a user runs it, its profile's coverage, and its analysis's verdicts."""
    run_dir = work / f"{workload}{'_train' if train else ''}_{mode}"
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
        pass_phases=pass_phases(run_dir, t0_epoch),
    )
    row.update(_verdicts(run_dir))
    busy = row.get("no_profiler_gpu_busy_ns")
    if busy:
        row["operator_time_vs_unprofiled_pct"] = round(100.0 * (op_time - busy) / busy, 2)
    graph_busy = row.get("graph_replay_gpu_busy_ns")
    if graph_busy:
        row["operator_time_vs_graph_replay_pct"] = round(100.0 * (op_time - graph_busy) / graph_busy, 2)
    return row


def _verdicts(run_dir: Path) -> dict[str, object]:
    """What `analyze` concludes, beside the unprofiled and the profiled window."""
    profile = load_profile(run_dir / "profile.json")
    analysis = analyze_profile(profile, run_dir / "analysis")
    t, sol = analysis.timeline, analysis.speed_of_light
    top = analysis.opportunities[0] if analysis.opportunities else None
    return {
        "unprofiled": bool(t and t.unprofiled), "window_ms": t.window_ns / 1e6 if t else None,
        "gpu_busy_pct": round(t.gpu_utilization_pct, 1) if t else None,
        "profiled_window_ms": t.profiled_window_ns / 1e6 if t and t.profiled_window_ns else None,
        "profiled_gpu_busy_pct": round(t.profiled_gpu_utilization_pct, 1)
        if t and t.profiled_gpu_utilization_pct is not None else None,
        "verdict": analysis.diagnosis.bottleneck.value,
        "top_opportunity": f"{top.title}: <= {top.estimated_saving_ns / 1e3:.1f} us ({top.estimated_saving_pct:.1f} %)"
        if top else None,
        "speed_of_light_pct": round(sol.pct_of_speed_of_light, 1) if sol else None,
        "max_plausible_speedup": round(sol.max_plausible_speedup, 2) if sol else None,
        "clocks": profile.capture_metadata.clocks.model_dump(),
    }


def pass_phases(run_dir: Path, t0_epoch: float) -> dict[str, dict[str, float]]:
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
    parser.add_argument("--no-references", action="store_true",
                        help="skip the two reference timings (queued ahead, graph replay) before each run")
    parser.add_argument("--profiles", action="store_true",
                        help="also bring back each run's profile.json as --out/profiles/<workload>_<mode>.json")
    parser.add_argument("--pack", action="append", default=[],
                        help="also bring back <workload>_<mode>'s run directory as a tar.xz in --out (repeatable)")
    args = parser.parse_args()
    os.environ.setdefault("OPERATOR_PROFILER_EXAMPLE_SCALE", "full")
    shutil.rmtree(args.work, ignore_errors=True)
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_".join(args.modes.split(","))
    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            row = measure(workload, mode, args.work, references=not args.no_references)
            rows.append(row)
            print(json.dumps(row), flush=True)
            name = f"{str(row['workload']).replace('+', '_')}_{mode}"
            if args.profiles and (args.work / name / "profile.json").is_file():
                (args.out / "profiles").mkdir(parents=True, exist_ok=True)
                shutil.copy(args.work / name / "profile.json", args.out / "profiles" / f"{name}.json")
            (args.out / f"targets_{suffix}.json").write_text(json.dumps(rows, indent=1))  # each row as it comes
    for name in args.pack:
        for rep in (args.work / name).glob("*/report.nsys-rep"):
            rep.unlink()
        subprocess.run(["tar", "-cJf", str(args.out / f"{name}.tar.xz"), "-C", str(args.work), name],
                       check=True, env={**os.environ, "XZ_OPT": "-6"})
    print(f"\n{'workload':26s} {'mode':9s} {'run s':>6s} {'kernels':>7s} {'attrib %':>8s} {'window ms':>9s} "
          f"{'busy %':>6s} {'prof. ms':>8s} {'prof. %':>7s} {'SOL %':>5s} verdict / top opportunity")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:26s} {r['mode']:9s} {r['run_wall_s']:6.1f} ERROR {r['error']}")
            continue
        print(f"{r['workload']:26s} {r['mode']:9s} {r['run_wall_s']:6.1f} {r['kernels']:7d} {r['attributed_pct']:8.2f} "
              f"{r['window_ms'] or 0:9.3f} {r['gpu_busy_pct'] or 0:6.1f} {r['profiled_window_ms'] or 0:8.3f} "
              f"{r['profiled_gpu_busy_pct'] or 0:7.1f} {r['speed_of_light_pct'] or 0:5.0f} {r['verdict']} / "
              f"{r['top_opportunity']}")


if __name__ == "__main__":
    main()
