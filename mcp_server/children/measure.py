"""Measure child: time one way of running one workload, alone in its process (standard library and torch only).

    python measure.py --workload W.py --out result.json
        [--recipe NAME | --optimized W_optimized.py]   # neither: the workload as written
        [--seed 0] [--input-sets 4] [--warmup 20] [--calls 100] [--queued 200] [--blocks 3] [--budget-s 3]
        [--validate-seeds 0,1,2] [--gpu-lock PATH | --turns FIFO]

Builds the workload with `get_model_and_input()` under the seed; with `--recipe` applies that free recipe
(`recipe.py`), with `--optimized` builds the optimized workload, loads the baseline's state_dict into it and runs it
through its `optimize(model)`, each input set converted once by its `prepare_inputs` where it has one. After the
first call (compilation included, timed apart) and the warm-up calls, it times, under `torch.no_grad()`, rotating
among `--input-sets` input sets:
- latency: each call alone, CUDA events around it and a synchronisation after it (`perf_counter_ns` on the CPU);
- back-to-back: `--queued` calls queued, one synchronisation, the time per call, `--blocks` times.
Counts shrink so that the timing fits `--budget-s` (at least 10 calls each). With `--validate-seeds`, each seed's
model and inputs are built again, run in fp32 eager with TF32 off as the reference, and through the recipe with
the seed's weights loaded: every output's error is recorded as validate records it. With `--gpu-lock`, the build,
compilation, warm-up and validation take the GPU shared and the timed window exclusively (`gpu_lock.GpuTurns`).
With `--turns`, the timing comes in `--blocks` blocks (latency calls, then one back-to-back block), each when the
engine writes a byte to that FIFO: it says `ready` once warmed up and `block K done` after each, so that two such
processes take turns block by block (`proof/turns.py`). The raw times go to `--out` as JSON; statistics are the
engine's.
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - this package importable, this folder off sys.path

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from mcp_server.children.common import (
    as_call,
    clone,
    device_of,
    flatten,
    inputs_preparer,
    load_same_weights,
    load_workload,
    model_and_inputs,
    optimized_callable,
    run_main,
    seed_all,
    synchronize,
    varied_inputs,
)
from mcp_server.children.contract import REFERENCE_RECIPE
from mcp_server.children.gpu_lock import GpuTurns
from mcp_server.children.numerics import Checks, compare_leaf, exact_fp32, written_error
from mcp_server.children.recipe import NotApplicable, apply, model_facts

MARKER = "operator_profiler_measure:"
MIN_CALLS = 10
REWARM_CALLS, REWARM_S = 10, 0.3
RECIPE_RTOL = 1e-2  # the loosest tier's: errors are recorded, the engine sorts recipes into tiers


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler measure child: one way of running a workload")
    parser.add_argument("--workload", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--recipe")
    how.add_argument("--optimized", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input-sets", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--queued", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=3.0)
    parser.add_argument("--validate-seeds", default="")
    turn = parser.add_mutually_exclusive_group()
    turn.add_argument("--gpu-lock", type=Path)
    turn.add_argument("--turns", type=Path)
    return parser.parse_args(argv)


def _say(text: str) -> None:
    print(f"{MARKER} {text}", flush=True)


class _Runner:
    """The callable under test and its input sets, called in turn."""

    def __init__(self, fn: Any, input_sets: list[Any], graphs: bool) -> None:
        self.fn = fn
        self.calls = [as_call(s) for s in input_sets]
        self.graphs = graphs
        self.count = 0

    def __call__(self) -> Any:
        args, kwargs = self.calls[self.count % len(self.calls)]
        self.count += 1
        if self.graphs:
            import torch

            torch.compiler.cudagraph_mark_step_begin()
        return self.fn(*args, **kwargs)


def _host_call_ns(run: _Runner) -> int:
    t0 = time.perf_counter_ns()
    run()
    synchronize()
    return time.perf_counter_ns() - t0


def _latency(run: _Runner, calls: int, cuda: bool) -> list[int]:
    """Each call alone: events around it on a GPU, then a synchronisation; the host clock on the CPU."""
    if not cuda:
        return [_host_call_ns(run) for _ in range(calls)]
    import torch

    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(calls):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(int(round(start.elapsed_time(end) * 1e6)))
    return times


def _back_to_back(run: _Runner, queued: int, blocks: int, cuda: bool) -> list[float]:
    """`queued` calls with one synchronisation at the end, per call, `blocks` times."""
    import torch

    per_call = []
    for _ in range(blocks):
        synchronize()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(queued):
                run()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) * 1e6 / queued)
        else:
            t0 = time.perf_counter_ns()
            for _ in range(queued):
                run()
            per_call.append((time.perf_counter_ns() - t0) / queued)
    return per_call


def _timed(run: _Runner, latency_calls: int, queued: int, blocks: int, cuda: bool) -> tuple[list[int], list[float]]:
    """Latency calls, then back-to-back blocks, the garbage collector off."""
    gc.collect()
    gc.disable()
    try:
        return _latency(run, latency_calls, cuda), _back_to_back(run, queued, blocks, cuda)
    finally:
        gc.enable()


def _turn(fifo: int) -> None:
    """Wait for the engine's byte: this process's turn to time a block."""
    if not os.read(fifo, 1):
        raise RuntimeError("the engine closed the turns FIFO before this process's turn")


def _time_in_turns(run: _Runner, args: argparse.Namespace, per_block: int, queued: int, cuda: bool,
                   result: dict[str, Any], per_call_ns: float) -> None:
    """The timed window in `args.blocks` blocks, each on the engine's signal: latency calls, then one back-to-back
    block; `latency_blocks` holds each block's count of latency calls. The first block is preceded by the full
    re-warm (the GPU may have idled while the other process compiled), the others by a few calls."""
    # Opened for reading and writing: it never reads as closed while the engine has not opened it yet.
    fifo = os.open(args.turns, os.O_RDWR)
    try:
        result["latency_ns"], result["back_to_back_ns"], result["latency_blocks"] = [], [], []
        _say("ready")
        for k in range(args.blocks):
            _turn(fifo)
            if k == 0:
                _rewarm(run, per_call_ns)
            else:
                for _ in range(REWARM_CALLS):  # the other process's kernels held the GPU and its caches until now
                    run()
                synchronize()
            result["cpus"].append(_cpu())
            latency, back_to_back = _timed(run, per_block, queued, 1, cuda)
            result["latency_ns"] += latency
            result["back_to_back_ns"] += back_to_back
            result["latency_blocks"].append(per_block)
            _say(f"block {k + 1} done")
    finally:
        os.close(fifo)


def _build(module: Any, seed: int) -> tuple[Any, Any]:
    """The workload's (model, inputs) under `seed`, checked against the contract (any callable model)."""
    seed_all(seed)
    return model_and_inputs(module.get_model_and_input(), False)


def _how(args: argparse.Namespace, base_mod: Any, model: Any, device: str, result: dict[str, Any]) -> tuple[Any, Any]:
    """The callable to time and the input transform, as args ask; fills `how_run`."""
    if args.recipe:
        applied = apply(model, args.recipe, device)
        result["how_run"], result["graphs"] = applied.how, applied.graphs
        return applied.fn, applied.prepare
    if args.optimized is not None:
        result["phase"] = "build optimized"
        opt_mod = load_workload(args.optimized)
        opt_model, _ = _build(opt_mod, args.seed)
        why = load_same_weights(model, opt_model)
        if why:
            result["warnings"].append(why)
        result["phase"] = "apply"
        fn, how = optimized_callable(opt_mod, opt_model)
        if fn is opt_model:
            result["warnings"].append(f"the optimized workload ran as {how}: nothing was compiled")
        result["how_run"], result["graphs"] = how, True
        return fn, inputs_preparer(opt_mod)
    result["how_run"], result["graphs"] = "as written (eager)", False
    return model, lambda x: x


def _recipe_opts() -> dict[str, Any]:
    """How a recipe's outputs are compared: every error recorded at the loosest tier's tolerance."""
    return {"rtol": RECIPE_RTOL, "atol": None, "tolerances": {}, "tf32": False, "reduced": True}


def _validate(base_mod: Any, model: Any, fn: Any, prepare: Any, seeds: list[int], graphs: bool) -> dict[str, Any]:
    """Every seed: fp32 eager with TF32 off as the reference, then the recipe with that seed's weights."""
    import torch

    checks = Checks()
    opts = _recipe_opts()
    for seed in seeds:
        ref_model, inputs = _build(base_mod, seed)
        with torch.no_grad(), exact_fp32():  # on a copy: a model that changes its inputs in place changes its own
            ref_args, ref_kwargs = as_call(clone(inputs))
            reference = flatten(ref_model(*ref_args, **ref_kwargs))
            reference = [(p, t.detach().cpu() if isinstance(t, torch.Tensor) else t) for p, t in reference]
        if isinstance(model, torch.nn.Module):
            model.load_state_dict(ref_model.state_dict())
        del ref_model
        run = _Runner(fn, [prepare(inputs)], graphs)
        with torch.no_grad():
            outputs = [(p, t.detach().cpu() if isinstance(t, torch.Tensor) else t) for p, t in flatten(run())]
        if len(outputs) != len(reference):
            checks.problem("shapes_dtypes", f"seed {seed}: {len(outputs)} outputs, the reference has {len(reference)}")
            continue
        for (path, out), (_, ref) in zip(outputs, reference, strict=True):
            compare_leaf(path, out, ref, seed, "a", opts, checks)
        if not isinstance(model, torch.nn.Module):
            break  # a callable's weights cannot be swapped: the first seed only
    return {"seeds": seeds, "outputs": checks.outputs.get("numerics", []),
            "problems": {k: v for k, v in checks.problems.items() if k != "numerics"}}


def _rewarm(run: _Runner, per_call_ns: float) -> None:
    """A few calls right before the window: a GPU left idle while this process waited for it drops its clocks."""
    for _ in range(max(REWARM_CALLS, int(REWARM_S * 1e9 / max(per_call_ns, 1.0)))):
        run()
    synchronize()


def _counts(per_call_ns: float, args: argparse.Namespace) -> tuple[int, int]:
    """Latency calls and queued calls per block that fit the budget (a third for latency, the rest queued)."""
    per_call = max(per_call_ns, 1.0)
    latency = int(min(args.calls, max(MIN_CALLS, args.budget_s * 1e9 / 3 / per_call)))
    queued = int(min(args.queued, max(MIN_CALLS, args.budget_s * 1e9 * 2 / 3 / args.blocks / per_call)))
    return latency, queued


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Build, apply, warm up, time, validate; fill `result`."""
    import torch

    turns = GpuTurns(args.gpu_lock if torch.cuda.is_available() else None)
    result["phase"] = "load"
    base_mod = load_workload(args.workload)
    turns.shared()
    try:
        result["phase"] = "build"
        model, inputs = _build(base_mod, args.seed)
        call_args, call_kwargs = as_call(inputs)
        device = device_of(model, call_args, call_kwargs)
        result["device_type"] = device
        result["timer"] = "cuda_event" if device == "cuda" else "perf_counter"
        result["model"] = model_facts(model, inputs)
        if callable(getattr(base_mod, "train_step", None)):
            result["warnings"].append("the workload defines train_step: forward calls were timed (training steps "
                                      "are out of this measurement's scope)")
        result["phase"] = "input sets"
        varied, why = varied_inputs(model, inputs, [args.seed * 1000 + k for k in range(1, max(args.input_sets, 1))])
        if why:
            result["warnings"].append(why)
        sets = [inputs] + varied
        result["phase"] = "apply"
        try:
            fn, prepare = _how(args, base_mod, model, device, result)
        except NotApplicable as exc:
            result["not_applicable"] = str(exc)
            return
        runner = _Runner(fn, [prepare(s) for s in sets], bool(result["graphs"]) and device == "cuda")
        with torch.no_grad():
            result["phase"] = "first call"
            _say("first call (compilation included)")
            result["first_call_ns"] = _host_call_ns(runner)
            result["phase"] = "warm-up"
            warm = [_host_call_ns(runner) for _ in range(max(args.warmup, 1))]
            result["warmup_time_ns"] = sum(warm)
            latency_calls, queued = _counts(statistics.median(warm[len(warm) // 2:]), args)
            result["queued_calls"] = queued
            if args.turns is not None:
                result["phase"] = "timing in turns"
                result["cpus"] = []
                per_block = max(1, -(-latency_calls // args.blocks))
                _say(f"timing in turns: {args.blocks} blocks of {per_block} calls alone and {queued} queued")
                _time_in_turns(runner, args, per_block, queued, device == "cuda", result, statistics.median(warm))
            else:
                _time_alone(runner, args, latency_calls, queued, device == "cuda", turns, result, warm)
        seeds = [int(s) for s in args.validate_seeds.split(",") if s.strip()]
        if seeds:
            result["phase"] = "validation"
            _say(f"validating against fp32 eager over seeds {seeds}")
            result["validation"] = _validate(base_mod, model, fn, prepare, seeds, runner.graphs)
            if args.recipe == REFERENCE_RECIPE:
                result["phase"] = "the reference against fp32"
                result["written_error"] = written_error(lambda seed: _build(base_mod, seed), seeds, _recipe_opts())
    finally:
        turns.release()


def _time_alone(run: _Runner, args: argparse.Namespace, latency_calls: int, queued: int, cuda: bool,
                turns: GpuTurns, result: dict[str, Any], warm: list[int]) -> None:
    """The timed window in one piece, the GPU held exclusively (other processes of a run may be compiling)."""
    result["phase"] = "waiting for the GPU"
    turns.exclusive()
    _rewarm(run, statistics.median(warm))
    result["phase"] = "timing"
    result["cpus"] = [_cpu()]
    _say(f"timing: {latency_calls} calls alone, {args.blocks} x {queued} queued")
    result["latency_ns"], result["back_to_back_ns"] = _timed(run, latency_calls, queued, args.blocks, cuda)
    result["cpus"].append(_cpu())
    turns.shared()


def _cpu() -> int | None:
    """The CPU this process runs on now (field 39 of /proc/self/stat), where Linux says."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Measure; write the result JSON whatever happens; return the exit code."""
    args = _parse_args(argv)
    return run_main(args.out, lambda result: run(args, result), "the measurement")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip interpreter teardown (CUDA and Inductor's compile workers take seconds); the result is on disk.
    os._exit(code)
