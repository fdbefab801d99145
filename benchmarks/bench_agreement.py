"""`operator-profiler bench` against an independent timer, each side in its own processes; and the old method.

    python benchmarks/bench_agreement.py --out FILE [--pairs conv_block mlp_activations] [--processes 3]
        [--rounds 3] [--cycles 2] [--methods timer loop] [--no-old-method]

For each example pair (the baseline as written, its committed optimized workload run through `optimize(model)`):
1. `operator-profiler bench` (3 rounds, one input set) reads both sides' latency and back-to-back medians per round;
2. two independent timers, `--processes` fresh processes per side and per timer, each building the side the same
   way: `torch.utils.benchmark.Timer.blocked_autorange` (which synchronises the GPU at the end of each block;
   back-to-back = the statement `fn(*args)`, latency = `fn(*args); torch.cuda.synchronize()`), and a plain loop
   (CUDA events around one call and a synchronisation, median of 100 calls after 20 warm-up calls; 200 calls queued
   with one synchronisation, per call). The medians of the processes' medians are compared with the median of
   bench's rounds: they should agree within 5 %. The methods take turns in time, `--cycles` times (bench, then the
   independent processes), since the host's speed drifts while they run;
3. the old method, in one process: the baseline under torch.compile(mode="reduce-overhead") and bf16 autocast (the
   old bench's free recipe) and the optimized workload built side by side and called interleaved (A B A B ...), each
   call timed with CUDA events and no synchronisation between calls, as the one-process bench did.
Prints a table last; writes every number to `--out` (JSON). Needs a GPU and the package installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SIDES = ("baseline", "optimized")


def _paths(name: str) -> tuple[Path, Path]:
    return EXAMPLES / name / f"{name}.py", EXAMPLES / name / f"{name}_optimized.py"


def build(name: str, side: str) -> tuple[Any, tuple[Any, ...], bool]:
    """The side's callable and inputs, as bench builds it: seed 0; the optimized model gets the baseline's weights,
    its inputs its `prepare_inputs` where it has one."""
    import importlib.util

    import torch

    from mcp_server.children.common import inputs_preparer

    base_path, opt_path = _paths(name)
    sys.path.insert(0, str(base_path.parent))

    def load(path: Path) -> Any:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module

    torch.manual_seed(0)
    model, inputs = load(base_path).get_model_and_input()
    if side == "baseline":
        return model, tuple(inputs), False
    opt = load(opt_path)
    torch.manual_seed(0)
    opt_model, _ = opt.get_model_and_input()
    opt_model.load_state_dict(model.state_dict())
    # converted once before the calls, as bench's measure child converts them
    return opt.optimize(opt_model), tuple(inputs_preparer(opt)(tuple(inputs))), True


def independent(name: str, side: str, method: str) -> dict[str, float]:
    """One process: warm up, then time latency and back-to-back (us per call) by `method`: `timer`,
    torch.utils.benchmark.Timer's blocked_autorange (1 s each); `loop`, CUDA events around one call and a
    synchronisation, median of 100 calls, and 200 calls queued with one synchronisation, per call."""
    import torch
    from torch.utils.benchmark import Timer

    fn, args, graphs = build(name, side)
    mark = torch.compiler.cudagraph_mark_step_begin if graphs else (lambda: None)
    scope = {"fn": fn, "args": args, "mark": mark, "torch": torch}
    with torch.no_grad():
        for _ in range(20):
            mark()
            fn(*args)
        torch.cuda.synchronize()
        if method == "timer":
            latency = Timer(stmt="mark(); fn(*args); torch.cuda.synchronize()", globals=scope).blocked_autorange(
                min_run_time=1.0)
            b2b = Timer(stmt="mark(); fn(*args)", globals=scope).blocked_autorange(min_run_time=1.0)
            return {"latency_us": latency.median * 1e6, "back_to_back_us": b2b.median * 1e6}
        latency, b2b = event_times(fn, args, mark, calls=100, queued=200, blocks=1)
    return {"latency_us": statistics.median(latency), "back_to_back_us": b2b[0]}


def event_times(fn: Any, args: tuple[Any, ...], mark: Any, calls: int, queued: int,
                blocks: int) -> tuple[list[float], list[float]]:
    """The plain loop (us): `calls` calls each alone, CUDA events around it and a synchronisation; then `blocks`
    times `queued` calls queued with one synchronisation, per call."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    latency = []
    for _ in range(calls):
        start.record()
        mark()
        fn(*args)
        end.record()
        end.synchronize()
        latency.append(start.elapsed_time(end) * 1e3)
    per_call = []
    for _ in range(blocks):
        start.record()
        for _ in range(queued):
            mark()
            fn(*args)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / queued)
    return latency, per_call


def interleaved(name: str, rounds: int = 6, reps: int = 20) -> dict[str, float]:
    """The old one-process method: both sides called interleaved, CUDA events around each call, no sync between."""
    import torch

    sides = {side: build(name, side) for side in SIDES}
    model, args, _ = sides["baseline"]
    compiled = torch.compile(model, mode="reduce-overhead")

    def free_recipe(*call_args: Any) -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return compiled(*call_args)

    sides["baseline"] = (free_recipe, args, True)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    with torch.no_grad():
        for _ in range(5):
            for fn, args, graphs in sides.values():
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                fn(*args)
        for r in range(rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES[::-1])
            pending = []
            for _ in range(reps):
                for side in order:
                    fn, args, graphs = sides[side]
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    if graphs:
                        torch.compiler.cudagraph_mark_step_begin()
                    start.record()
                    fn(*args)
                    end.record()
                    pending.append((side, start, end))
            torch.cuda.synchronize()
            for side, start, end in pending:
                times[side].append(start.elapsed_time(end) * 1e3)
    return {f"{side}_us": statistics.median(values) for side, values in times.items()}


def _child(args: list[str]) -> Any:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_pair(name: str, processes: int, rounds: int, cycles: int, methods: list[str],
                 old_method: bool) -> dict[str, Any]:
    """bench, the independent timers and (with `old_method`) the old method on one example pair.

    The host's speed drifts while processes run (`process_spread.py`: a host-bound call's time moves up to 2x within
    one process, over seconds), so the methods take turns in time: each of `cycles` cycles runs one bench of `rounds`
    rounds, then `processes` processes per side of each independent method, the sides alternating. Each method's
    figure is the median of its processes' medians, over every cycle."""
    base, opt = _paths(name)
    bench_rounds: dict[str, dict[str, list[float]]] = {s: {"latency": [], "back_to_back": []} for s in SIDES}
    bench_cpus: dict[str, list[Any]] = {s: [] for s in SIDES}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {m: {s: [] for s in SIDES} for m in methods}
    for _ in range(cycles):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(["operator-profiler", "bench", str(base), str(opt), "--rounds", str(rounds),
                            "--input-sets", "1", "--output", out, "--quiet"], check=True)
            bench = json.loads((Path(out) / "bench.json").read_text())
        for side in SIDES:
            for r in bench[side]["rounds"]:
                bench_rounds[side]["latency"].append(statistics.median(r["latency_ns"]) / 1e3)
                bench_rounds[side]["back_to_back"].append(statistics.median(r["back_to_back_ns"]) / 1e3)
                bench_cpus[side].append(r.get("cpus"))
        for _ in range(processes):
            for method in methods:
                for side in SIDES:
                    runs[method][side].append(_child(["--independent", name, side, method]))
    row: dict[str, Any] = {"pair": name, "cycles": cycles, "bench_rounds_per_cycle": rounds,
                           "processes_per_cycle": processes}
    for side in SIDES:
        for metric in ("latency", "back_to_back"):
            ours = statistics.median(bench_rounds[side][metric])
            cell: dict[str, Any] = {"bench_us": ours, "bench_rounds_us": bench_rounds[side][metric],
                                    "bench_cpus": bench_cpus[side]}
            for method in methods:
                found = [r[f"{metric}_us"] for r in runs[method][side]]
                theirs = statistics.median(found)
                cell[f"{method}_us"], cell[f"{method}_runs_us"] = theirs, found
                cell[f"vs_{method}"] = ours / theirs - 1
            row[f"{side}_{metric}"] = cell
    if old_method:
        row["old_interleaved"] = _child(["--interleaved", name])
    return row


def main() -> int:
    """Measure each pair; print the table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pairs", nargs="+", default=["conv_block", "mlp_activations"])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--methods", nargs="+", choices=("timer", "loop"), default=["timer", "loop"])
    parser.add_argument("--no-old-method", action="store_true", help="skip the one-process interleaved method")
    parser.add_argument("--independent", nargs=3, metavar=("PAIR", "SIDE", "METHOD"))
    parser.add_argument("--interleaved", metavar="PAIR")
    args = parser.parse_args()
    if args.independent or args.interleaved:
        found = independent(*args.independent) if args.independent else interleaved(args.interleaved)
        print(json.dumps(found), flush=True)
        os._exit(0)  # skip the interpreter's teardown (Inductor's compile workers take seconds)
    rows = [measure_pair(name, args.processes, args.rounds, args.cycles, args.methods, not args.no_old_method)
            for name in args.pairs]
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    heads = "".join(f" {m + ' us':>9s} {'diff':>7s}" for m in args.methods)
    print(f"{'pair':18s} {'side':9s} {'metric':12s} {'bench us':>9s}{heads}  per process: "
          + " | ".join(["bench", *args.methods]))
    for row in rows:
        for side in SIDES:
            for metric in ("latency", "back_to_back"):
                c = row[f"{side}_{metric}"]
                cells = "".join(f" {c[m + '_us']:9.1f} {c['vs_' + m] * 100:6.1f}%" for m in args.methods)
                spread = " | ".join(" ".join(f"{v:.0f}" for v in c[k]) for k in
                                    ["bench_rounds_us", *(m + "_runs_us" for m in args.methods)])
                print(f"{row['pair']:18s} {side:9s} {metric:12s} {c['bench_us']:9.1f}{cells}  {spread}")
        old = row.get("old_interleaved")
        if old:
            print(f"{row['pair']:26s} old one-process interleaved events: baseline {old['baseline_us']:.1f} us, "
                  f"optimized {old['optimized_us']:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
