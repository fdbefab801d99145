"""Bench child: time a baseline and an optimized workload, interleaved, in one process (stdlib + torch only).

    python bench.py --baseline B.py --optimized B_optimized.py --out result.json
        [--warmup 5] [--reps 20] [--rounds 6] [--input-sets 4] [--seed 0]
        [--baseline-mode eager|inductor|reduce-overhead|inductor-bf16|reduce-overhead-bf16]

Both workloads are built with `get_model_and_input()` under the same seed, on the same device; the optimized
model gets the baseline's state_dict, and is run through its `optimize(model)` (else
`torch.compile(model, backend=BACKEND_NAME)`). Each side rotates through its own `--input-sets` input sets (its
own inputs, then copies with fresh random values), so neither side finds the other's data in cache. Round r
runs `--reps` calls per side as A B A B ..., the baseline first in even rounds and the optimized first in odd
ones. Calls are timed with CUDA events on a GPU and `time.perf_counter_ns` on the CPU; the raw per-call times
go to `--out` as JSON, statistics are the engine's job. Clocks are never touched.
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - this package importable, this folder off sys.path

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

from mcp_server.children.common import (
    as_call,
    device_of,
    load_same_weights,
    load_workload,
    model_and_inputs,
    optimized_callable,
    perturb,
    run_main,
    seed_all,
    synchronize,
)
from mcp_server.children.contract import AUTOCAST_HOW, BASELINE_RECIPES

MARKER = "operator_profiler_bench:"
SIDES = ("baseline", "optimized")


def baseline_recipe(model: Any, recipe: str, device: str) -> tuple[Any, str]:
    """The baseline as a user runs it for free: as written, under `torch.compile` (default mode or
    `mode="reduce-overhead"`, CUDA graphs), optionally inside bf16 autocast; and how that reads in bench.json."""
    import torch

    if recipe == "eager":
        return model, "eager"
    mode = "reduce-overhead" if recipe.startswith("reduce-overhead") else None
    compiled = torch.compile(model, mode=mode) if mode else torch.compile(model)
    how = f"torch.compile (mode={mode!r})" if mode else "torch.compile (inductor)"
    if not recipe.endswith("-bf16"):
        return compiled, how

    def autocast(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=torch.bfloat16):
            return compiled(*args, **kwargs)

    return autocast, f"{how} {AUTOCAST_HOW}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler bench child: interleaved timing of two workloads")
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--optimized", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--input-sets", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline-mode", choices=BASELINE_RECIPES, default="eager")
    return parser.parse_args(argv)


class _Side:
    """One workload: its callable and its own rotating input sets."""

    def __init__(self, name: str, fn: Any, how: str, inputs: Any, input_sets: int, seed: int) -> None:
        self.name = name
        self.fn = fn
        self.how = how
        sets = [inputs] + [perturb(inputs, seed * 1000 + k) for k in range(1, input_sets)]
        self.calls = [as_call(s) for s in sets]
        self.samples: list[list[int]] = []
        self.first_call_ns = 0
        self.warmup_time_ns = 0

    def call(self, index: int) -> None:
        args, kwargs = self.calls[index % len(self.calls)]
        self.fn(*args, **kwargs)

    @staticmethod
    def begin_step() -> None:
        """Tell CUDA graph trees a new step begins: both sides' compiled CUDA graphs share one tree per device,
        and without a step boundary each interleaved call finds the other's outputs alive and re-records."""
        import torch

        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        if mark is not None and torch.cuda.is_available():
            mark()


class _Timer:
    """Per-call timing: CUDA events on a GPU (read once per round), perf_counter_ns on the CPU."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self._torch = torch
        self._pending: list[tuple[_Side, Any, Any]] = []
        self._host: list[tuple[_Side, int]] = []

    def time(self, side: _Side, index: int) -> None:
        if self.cuda:
            start = self._torch.cuda.Event(enable_timing=True)
            end = self._torch.cuda.Event(enable_timing=True)
            side.begin_step()
            start.record()
            side.call(index)
            end.record()
            self._pending.append((side, start, end))
        else:
            t0 = time.perf_counter_ns()
            side.call(index)
            self._host.append((side, time.perf_counter_ns() - t0))

    def collect(self) -> dict[str, list[int]]:
        """This round's per-call times per side, in call order."""
        times: dict[str, list[int]] = {name: [] for name in SIDES}
        if self.cuda:
            self._torch.cuda.synchronize()
            for side, start, end in self._pending:
                times[side.name].append(int(round(start.elapsed_time(end) * 1e6)))
        for side, ns in self._host:
            times[side.name].append(ns)
        self._pending, self._host = [], []
        return times


def _warm_up(sides: list[_Side], warmup: int) -> None:
    for side in sides:
        synchronize()
        t0 = time.perf_counter_ns()
        side.begin_step()
        side.call(0)
        synchronize()
        side.first_call_ns = time.perf_counter_ns() - t0
        side.warmup_time_ns = side.first_call_ns
    for i in range(1, max(warmup, 1)):
        for side in sides:
            t0 = time.perf_counter_ns()
            side.begin_step()
            side.call(i)
            synchronize()
            side.warmup_time_ns += time.perf_counter_ns() - t0


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Build both sides, warm up, and run the interleaved rounds; fill `result`."""
    import torch

    result["phase"] = "load baseline"
    base_mod = load_workload(args.baseline)
    result["phase"] = "load optimized"
    opt_mod = load_workload(args.optimized)
    with torch.no_grad():
        result["phase"] = "build baseline"
        seed_all(args.seed)
        base_model, base_inputs = model_and_inputs(base_mod.get_model_and_input(), False)
        result["phase"] = "build optimized"
        seed_all(args.seed)
        opt_model, opt_inputs = model_and_inputs(opt_mod.get_model_and_input(), False)
        why = load_same_weights(base_model, opt_model)
        if why:
            result["warnings"].append(why)
        call_args, call_kwargs = as_call(base_inputs)
        device = device_of(base_model, call_args, call_kwargs)
        base_fn, base_how = baseline_recipe(base_model, args.baseline_mode, device)
        if args.baseline_mode.startswith("reduce-overhead") and device != "cuda":
            result["warnings"].append("mode='reduce-overhead' records CUDA graphs only on a GPU: on the CPU it "
                                      "compiles as the default mode")
        opt_fn, opt_how = optimized_callable(opt_mod, opt_model)
        if opt_fn is opt_model:
            result["warnings"].append(f"the optimized workload ran as {opt_how}: nothing was compiled")
        if callable(getattr(base_mod, "train_step", None)):
            result["warnings"].append("the workload defines train_step: bench timed forward calls only (training "
                                      "steps are out of bench's scope)")
        result["device_type"] = device
        result["timer"] = "cuda_event" if device == "cuda" else "perf_counter"
        sides = [
            _Side("baseline", base_fn, base_how, base_inputs, args.input_sets, args.seed),
            _Side("optimized", opt_fn, opt_how, opt_inputs, args.input_sets, args.seed),
        ]
        result["phase"] = "warm-up"
        print(f"{MARKER} warm-up ({args.warmup} calls per side, compilation included)", flush=True)
        _warm_up(sides, args.warmup)
        result["phase"] = "timing"
        timer = _Timer(device == "cuda")
        orders: list[list[str]] = []
        gc.collect()
        gc.disable()
        try:
            for r in range(args.rounds):
                print(f"{MARKER} round {r + 1}/{args.rounds}", flush=True)
                order = sides if r % 2 == 0 else sides[::-1]
                orders.append([s.name for s in order])
                for i in range(args.reps):
                    for side in order:
                        timer.time(side, r * args.reps + i)
                times = timer.collect()
                for side in sides:
                    side.samples.append(times[side.name])
        finally:
            gc.enable()
    result["orders"] = orders
    result["sides"] = {
        s.name: {
            "workload": str(args.baseline if s.name == "baseline" else args.optimized),
            "how_run": s.how,
            "first_call_ns": s.first_call_ns,
            "warmup_time_ns": s.warmup_time_ns,
            "samples_ns": s.samples,
        }
        for s in sides
    }


def main(argv: list[str] | None = None) -> int:
    """Run the bench; write the result JSON whatever happens; return the exit code."""
    args = _parse_args(argv)
    return run_main(args.out, lambda result: run(args, result), "the bench")


if __name__ == "__main__":
    sys.exit(main())
