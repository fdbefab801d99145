"""Where bench and `torch.utils.benchmark.Timer` differ on one side, all methods in one process, taking turns.

    python benchmarks/timer_offset.py --out FILE [--pairs mlp_activations conv_block] [--repeats 5]

`bench_agreement.py` found bench 2-8 % under Timer on the CUDA-graphed optimized sides of mlp_activations and
conv_block, each in processes of its own, and level on the GPU-bound eager sides. Here one process per pair builds
the optimized side as bench does (`bench_agreement.build`) and times it by each method in turn, `--repeats` times:
- `events_*`: bench's own timers, CUDA events around one call and its synchronisation (latency) and around 200
  queued calls (back-to-back);
- `wall_*`: the same loops timed by the host's clock, synchronised before and after;
- `timer_*`: `Timer.blocked_autorange(min_run_time=0.5)` of `step(); torch.cuda.synchronize()` (latency) and
  `step()` (back-to-back);
each with the same input set every call (`fixed`) and with four copies of it in memory of their own, in turn
(`rotating`, as bench rotates its input sets). Prints each method's median of its repeats (µs per call) and
writes every number to `--out`. Needs a GPU and the package installed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_agreement import build  # noqa: E402

QUEUED, LATENCY_CALLS = 200, 100


def methods(fn: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """The timed methods on `fn`, each a callable returning µs per call."""
    import torch
    from torch.utils.benchmark import Timer

    copies = [args] + [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args) for _ in range(3)]
    mark = torch.compiler.cudagraph_mark_step_begin
    state = {"i": 0}

    def fixed() -> Any:
        mark()
        return fn(*args)

    def rotating() -> Any:
        state["i"] += 1
        mark()
        return fn(*copies[state["i"] % len(copies)])

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def events_latency(step: Any) -> float:
        times = []
        for _ in range(LATENCY_CALLS):
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    def events_b2b(step: Any) -> float:
        torch.cuda.synchronize()
        start.record()
        for _ in range(QUEUED):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / QUEUED

    def wall_latency(step: Any) -> float:
        times = []
        for _ in range(LATENCY_CALLS):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        return statistics.median(times)

    def wall_b2b(step: Any) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(QUEUED):
            step()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e3 / QUEUED

    def timer(stmt: str, step: Any) -> float:
        scope = {"step": step, "torch": torch}
        return Timer(stmt=stmt, globals=scope).blocked_autorange(min_run_time=0.5).median * 1e6

    table: dict[str, Any] = {}
    for name, step in (("fixed", fixed), ("rotating", rotating)):
        table[f"events_latency_{name}"] = lambda s=step: events_latency(s)
        table[f"wall_latency_{name}"] = lambda s=step: wall_latency(s)
        table[f"timer_latency_{name}"] = lambda s=step: timer("step(); torch.cuda.synchronize()", s)
        table[f"events_b2b_{name}"] = lambda s=step: events_b2b(s)
        table[f"wall_b2b_{name}"] = lambda s=step: wall_b2b(s)
        table[f"timer_b2b_{name}"] = lambda s=step: timer("step()", s)
    return table


def measure(name: str, repeats: int) -> dict[str, Any]:
    """Every method on the pair's optimized side, `repeats` times in turn; µs per call."""
    import torch

    fn, args, _ = build(name, "optimized")
    table = methods(fn, args)
    runs: dict[str, list[float]] = {m: [] for m in table}
    with torch.no_grad():
        for m in table:  # warm-up: each method's path once
            table[m]()
        for _ in range(repeats):
            for m, time_it in table.items():
                runs[m].append(round(time_it(), 2))
    return {"pair": name, "runs_us": runs, "median_us": {m: statistics.median(v) for m, v in runs.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pairs", nargs="+", default=["mlp_activations", "conv_block"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for name in args.pairs:
        rows.append(measure(name, args.repeats))
        for m, v in rows[-1]["median_us"].items():
            print(f"{name:18} {m:24} {v:9.1f}  {rows[-1]['runs_us'][m]}", flush=True)
    if args.out is not None:
        import torch

        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
