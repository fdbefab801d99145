"""Why one workload's time per call moves between processes: fresh processes under conditions taken in turn.

    python benchmarks/process_spread.py --out FILE [--pair mlp_activations] [--side optimized] [--processes 4]
        [--conditions plain pinned no-workers hashseed0 hashseed1]

Each process builds one side of an example pair as `bench_agreement.py` does (the optimized workload through
`optimize(model)`), warms it up, and times, in this order: the host's launch time per call (perf_counter around the
call alone, the GPU synchronised before it), latency (CUDA events around one call and a synchronisation, median of
200) and back-to-back (200 calls queued, one synchronisation, per call, three blocks). The conditions are taken in
turn, process by process (A B C A B C ...), so a drift of the machine reaches each of them alike:
- `plain`: as bench starts its children;
- `pinned`: the process bound to one CPU (`os.sched_setaffinity`) before torch is imported;
- `no-workers`: `TORCHINDUCTOR_COMPILE_THREADS=1`, so Inductor starts no pool of compile workers;
- `hashseed0`, `hashseed1`: `PYTHONHASHSEED` fixed at 0 or 1 (Python's hash randomisation is per process).
The host's launch time is also taken in three segments (start, middle, end of the timing) to tell a process's own
state from a machine that drifts while it runs.
An nvidia-smi poll (every 50 ms) runs beside the processes; each process's SM clocks while it timed are kept.
Prints a table last; writes every number to `--out` (JSON). Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

CONDITIONS = ("plain", "pinned", "no-workers", "hashseed0", "hashseed1")
ENV = {"no-workers": {"TORCHINDUCTOR_COMPILE_THREADS": "1"}, "hashseed0": {"PYTHONHASHSEED": "0"},
       "hashseed1": {"PYTHONHASHSEED": "1"}}


def timed(pair: str, side: str) -> dict[str, Any]:
    """One process's measurement (see the module's docstring)."""
    pin = os.environ.get("SPREAD_PIN")
    if pin:
        os.sched_setaffinity(0, {int(pin)})
    import gc

    import torch
    from bench_agreement import build, event_times

    fn, args, graphs = build(pair, side)
    mark = torch.compiler.cudagraph_mark_step_begin if graphs else (lambda: None)
    with torch.no_grad():
        for _ in range(30):
            mark()
            fn(*args)
        torch.cuda.synchronize()
        gc.collect()
        gc.disable()
        segments = [host_launch(fn, args, mark)]
        segments.append(host_launch(fn, args, mark, calls=200))
        t_start = time.time()
        latency, b2b = event_times(fn, args, mark, calls=200, queued=200, blocks=3)
        t_end = time.time()
        segments.append(host_launch(fn, args, mark))
        gc.enable()
    return {"host_launch_us": segments[1], "host_segments_us": segments, "latency_us": statistics.median(latency),
            "back_to_back_us": statistics.median(b2b), "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "window": [t_start, t_end]}


def host_launch(fn: Any, args: Any, mark: Any, calls: int = 100) -> float:
    """Median host time (us) of `calls` calls, each alone after the GPU synchronised."""
    import torch

    found = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        mark()
        fn(*args)
        found.append(time.perf_counter_ns() - t0)
    torch.cuda.synchronize()
    return statistics.median(found) / 1e3


def _poll_clocks(path: Path) -> subprocess.Popen[bytes] | None:
    try:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader",
                                 "-lms", "50"], stdout=path.open("wb"), stderr=subprocess.DEVNULL)
    except OSError:
        return None


def _clocks_in(path: Path, window: list[float]) -> list[float]:
    """SM clocks (MHz) nvidia-smi printed while the window ran (its timestamps are local time, to the ms)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = time.mktime(time.strptime(parts[0][:19], "%Y/%m/%d %H:%M:%S")) + float("0" + parts[0][19:])
            mhz = float(parts[1].split()[0])
        except (IndexError, ValueError):
            continue
        if window[0] - 0.05 <= stamp <= window[1] + 0.05:
            found.append(mhz)
    return found


def main() -> int:
    """Run the processes in turn; print the table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pair", default="mlp_activations")
    parser.add_argument("--side", default="optimized")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS[:3]))
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(timed(args.pair, args.side)), flush=True)
        os._exit(0)  # skip the interpreter's teardown (Inductor's compile workers take seconds)
    clock_log = Path(os.environ.get("TMPDIR", "/tmp")) / f"process_spread_clocks_{os.getpid()}.csv"
    poll = _poll_clocks(clock_log)
    rows: list[dict[str, Any]] = []
    try:
        for k in range(args.processes * len(args.conditions)):
            condition = args.conditions[k % len(args.conditions)]
            env = {**os.environ, **ENV.get(condition, {})}
            if condition == "pinned":
                env["SPREAD_PIN"] = str(sorted(os.sched_getaffinity(0))[1])
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, __file__, "--child", "--pair", args.pair, "--side", args.side],
                                 capture_output=True, text=True, env=env, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(condition=condition, wall_s=round(time.monotonic() - t0, 1))
            rows.append(row)
            segs = " ".join(f"{v:.0f}" for v in row["host_segments_us"])
            print(f"{condition:10s} host {segs} latency {row['latency_us']:7.1f} "
                  f"b2b {row['back_to_back_us']:7.1f} us  ({row['wall_s']} s)", flush=True)
    finally:
        if poll is not None:
            poll.terminate()
            poll.wait()
    for row in rows:
        clocks = _clocks_in(clock_log, row["window"])
        row["sm_clock_mhz"] = [min(clocks), statistics.median(clocks), max(clocks)] if clocks else None
    if args.out:
        args.out.write_text(json.dumps({"pair": args.pair, "side": args.side, "rows": rows}, indent=1) + "\n")
    print(f"{'condition':10s} {'host us':>8s} {'latency':>8s} {'b2b':>8s}  SM MHz min/median/max while timing")
    for row in rows:
        print(f"{row['condition']:10s} {row['host_launch_us']:8.1f} {row['latency_us']:8.1f} "
              f"{row['back_to_back_us']:8.1f}  {row['sm_clock_mhz']}")
    for condition in args.conditions:
        lat = [r["latency_us"] for r in rows if r["condition"] == condition]
        print(f"{condition:10s} latency spread {min(lat):.0f}-{max(lat):.0f} us (max/min {max(lat) / min(lat):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
