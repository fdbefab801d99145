"""An independent timer for a plain training script's step: what the script's step costs with nothing of the
profiler loaded, to check the window `run --script` reports as measured without the profiler.

    python benchmarks/script_step_timer.py [--out FILE.json] SCRIPT.py [-- SCRIPT_ARGS...]

The script runs as `__main__` in a fresh process per variant, rounds alternating, with one CUDA event recorded after
every optimizer step (torch's global optimizer-step post hook, no synchronisation); the step is the time between
consecutive events, the median over the steps after the first `--skip`. Variants:

- `plain`: nothing else;
- `noop_hooks`: global module forward pre/post hooks that do nothing (what any global hook costs a module call: its
  slow call path);
- `module_paths`: Operator Profiler's own global module hooks (`children.global_modules`, no ranges), as a script's
  passes install them;
- `threads4`: torch's intra-op threads held to 4, as `run` holds each of its passes running at once to its share of
  the CPUs;
- `synced`: the device synchronised after every step and the step timed from there (a window that starts with an
  idle GPU and an empty queue, as the product's windows do).

GPU machine only. Prints and writes one JSON record per variant (median, quartiles, steps timed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHILD = """
import json, runpy, sys
import torch
script, variant, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
events, starts = [], []
def after_step(optimizer, args, kwargs):
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    events.append(event)
    if variant == "synced":
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        starts.append(start)
from torch.optim.optimizer import register_optimizer_step_post_hook
register_optimizer_step_post_hook(after_step)
if variant == "noop_hooks":
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    register_module_forward_pre_hook(lambda module, args: None)
    register_module_forward_hook(lambda module, args, output: None, always_call=True)
elif variant == "threads4":
    torch.set_num_threads(4)
elif variant == "module_paths":
    sys.path.insert(0, sys.argv[4])
    from mcp_server.children.global_modules import GlobalModules
    GlobalModules("none").install()
sys.argv = [script, *sys.argv[5:]]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
runpy.run_path(script, run_name="__main__")
torch.cuda.synchronize()
steps = [a.elapsed_time(b) for a, b in zip(starts or events, events[1:])][skip:]
print("STEPS_MS", json.dumps(steps), flush=True)
"""
VARIANTS = ("plain", "noop_hooks", "module_paths", "threads4", "synced")


def timed(script: Path, variant: str, skip: int, script_args: list[str]) -> list[float]:
    """One fresh process of `script` under `variant`: its step times in ms."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(script), variant, str(skip), str(REPO), *script_args],
                          capture_output=True, text=True, timeout=600, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("STEPS_MS ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{script.name} ({variant}) failed (exit {done.returncode}): {done.stderr[-800:]}")
    return [float(x) for x in json.loads(line.removeprefix("STEPS_MS "))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("script_args", nargs="*")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip", type=int, default=5, help="steps left out first (warm-up)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = parser.parse_args()
    variants = args.variants.split(",")
    steps: dict[str, list[float]] = {v: [] for v in variants}
    per_process: dict[str, list[float]] = {v: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants if round_ % 2 == 0 else reversed(variants):
            times = timed(args.script.resolve(), variant, args.skip, args.script_args)
            steps[variant] += times
            per_process[variant].append(round(statistics.median(times), 3))
    rows = []
    for variant, times in steps.items():
        q = statistics.quantiles(times, n=4) if len(times) > 1 else times * 3
        rows.append({"script": args.script.name, "variant": variant, "median_ms": round(statistics.median(times), 3),
                     "q1_ms": round(q[0], 3), "q3_ms": round(q[2], 3), "steps": len(times),
                     "process_medians_ms": per_process[variant]})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
