"""Validate child: is an optimized workload's output the baseline's? (standard library and torch only)

    python validate.py --baseline B.py --optimized B_optimized.py --out result.json
        [--seeds 0,1,2] [--tolerances '{"float32": 1e-4}'] [--rtol X] [--atol Y]

For each seed: build the baseline with `get_model_and_input()`, compute its outputs on its own inputs ('a') and
on fresh random inputs of the same shapes ('b'); build the optimized model, load the baseline's state_dict into
it, call `optimize(model)` and run it on copies of the same inputs, a then b. Checks (see
docs/optimized-workload-contract.md): contract, backend_registered, backend_invoked, fx_passes, runs,
shapes_dtypes, finite, numerics, input_mutation, output_aliasing, output_caching. The registered backend is
wrapped with a call counter before `optimize()` runs. Writes the checks as JSON to `--out`; an error of the
baseline itself (or a missing torch) is written as status 'error'.
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - this package importable, this folder off sys.path

import argparse
import functools
import json
import sys
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
    perturb,
    recipe_of,
    refusal,
    run_main,
    seed_all,
    traceback_tail,
)
from mcp_server.children.contract import written_floor
from mcp_server.children.numerics import (
    Checks,
    all_equal,
    call,
    compare_leaf,
    loosens,
    lowered_outputs,
    precision_flags,
    restore_flags,
    shared_memory,
    tf32_regime,
    within_tolerance,
    written_error,
)

DEFAULT_TOLERANCES = {"float64": 1e-7, "float32": 1e-4, "tf32": 1e-3, "bfloat16": 1e-2, "float16": 1e-2}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler validate child")
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--optimized", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tolerances", default="{}", help="JSON: tolerance class -> rtol")
    parser.add_argument("--rtol", type=float, default=None, help="one rtol for every floating output")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: rtol x output RMS)")
    parser.add_argument("--tier", choices=("exact", "reduced", "fp8"), default="exact",
                        help="reduced, fp8: float32/float64 outputs may come back in bfloat16/float16")
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- the run


class _Counter:
    """Wraps the registered backend so every graph it compiles is counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.graph_nodes: list[int] = []
        self.installed = False
        self.note = ""

    def install(self, name: str) -> None:
        from torch._dynamo.backends import registry

        try:
            original = registry.lookup_backend(name)
        except Exception as exc:  # noqa: BLE001 - InvalidBackend and entry-point failures alike
            self.note = f"could not look the backend up: {type(exc).__name__}: {exc}"
            return

        @functools.wraps(original)
        def counting(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.graph_nodes.append(len(gm.graph.nodes))
            return original(gm, example_inputs, *args, **kwargs)

        try:
            registry._COMPILER_FNS[name] = counting
            self.installed = True
        except (AttributeError, TypeError) as exc:
            self.note = f"could not wrap the registered backend: {exc}"


def _applied_passes(module: Any) -> dict[str, int] | None:
    raw = getattr(module, "APPLIED_PASSES", None)
    if raw is None:
        return None
    counts: dict[str, int] = {}
    if isinstance(raw, dict):
        for key, value in raw.items():
            if isinstance(value, bool):
                if value:
                    counts[str(key)] = 1
            elif isinstance(value, (int, float)):
                if value:
                    counts[str(key)] = int(value)
            elif value:
                counts[str(key)] = 1
    else:
        for name in list(raw):
            counts[str(name)] = counts.get(str(name), 0) + 1
    return counts


def _contract(opt_mod: Any, checks: Checks) -> str | None:
    """Check the optimized module's interface; return its BACKEND_NAME (None when the contract is broken, or when
    the workload applies a free recipe, RECIPE, through its optimize(model) instead of a backend of its own)."""
    problems = []
    if not callable(getattr(opt_mod, "get_model_and_input", None)):
        problems.append("no callable get_model_and_input()")
    backend = getattr(opt_mod, "BACKEND_NAME", None)
    optimize = getattr(opt_mod, "optimize", None)
    if recipe_of(opt_mod) is not None:
        if not callable(optimize):
            problems.append("a RECIPE but no optimize(model) applying it")
    elif not isinstance(backend, str) or not backend:
        problems.append("no module-level BACKEND_NAME string naming its torch.compile backend (or RECIPE naming the "
                        "free recipe its optimize(model) applies)")
    if optimize is not None and not callable(optimize):
        problems.append("optimize is not callable")
    if problems:
        checks.set("contract", "fail", "the optimized workload has " + "; ".join(problems))
        return None
    return backend


def _widen_for_written_precision(base_mod: Any, seeds: list[int], tolerances: dict[str, float],
                                 result: dict[str, Any]) -> None:
    """For a baseline written in bfloat16/float16: every tolerance class at least twice its largest relative error
    against itself in float32 (`numerics.written_error`; two implementations of it may each be that far from fp32),
    the same floor `recipes` sorts its tiers by. `tolerances` is changed in place; the error goes into `result`."""
    result["phase"] = "the baseline against itself in fp32"

    def build(seed: int) -> tuple[Any, Any]:
        seed_all(seed)
        return model_and_inputs(base_mod.get_model_and_input(), False)

    found = written_error(build, seeds, {"rtol": max(tolerances.values()), "atol": None, "tolerances": {},
                                         "tf32": False, "reduced": True})
    if found is not None and found.get("failed"):
        result["warnings"].append(f"the baseline is written in bfloat16/float16 but did not run in float32 "
                                  f"({found['failed']}): its outputs are held to the default tolerances")
    values = [o["max_rel_error"] for o in (found or {}).get("outputs", []) if o.get("max_rel_error") is not None]
    if not values:
        return
    result["written_max_rel_error"] = max(values)
    for cls, rtol in tolerances.items():
        tolerances[cls] = max(rtol, written_floor(max(values)))


def _one_seed(
    seed: int, base_mod: Any, opt_mod: Any, flags: dict[str, Any], opts: dict[str, Any], checks: Checks,
    extremes: dict[str, float], state: dict[str, Any], result: dict[str, Any],
) -> bool:
    """Run baseline and optimized on one seed's two input sets and record every comparison; False stops."""
    warnings: list[str] = result["warnings"]
    restore_flags(flags, warnings)
    result["phase"] = f"baseline, seed {seed}"
    seed_all(seed)
    base_model, inputs_a = model_and_inputs(base_mod.get_model_and_input(), False)
    call_args, call_kwargs = as_call(inputs_a)
    opts["tf32"] = tf32_regime(flags, base_model) and device_of(base_model, call_args, call_kwargs) == "cuda"
    result["tf32"] = opts["tf32"]
    inputs_b = perturb(inputs_a, 7919 * (seed + 1))
    if getattr(base_model, "training", False) and seed == int(result["seeds"][0]):
        warnings.append("the baseline model is in training mode: dropout or batch statistics make outputs vary")
    if callable(getattr(base_mod, "train_step", None)) and seed == int(result["seeds"][0]):
        warnings.append("the workload defines train_step: validate compared forward outputs only (losses, "
                        "gradients and updated parameters are out of validate's scope)")
    ref_a, ref_a_snap, base_mut_a, base_alias_a = call(base_model, inputs_a)
    try:
        ref_b, ref_b_snap, base_mut_b, base_alias_b = call(base_model, inputs_b)
    except Exception as exc:  # noqa: BLE001 - a perturbation the model refuses: its own inputs again, said
        if seed == int(result["seeds"][0]):
            warnings.append(f"a perturbed copy of the inputs made the model as written raise ({refusal(exc)}): the "
                            "second call took the same inputs again, so a cached result is not detected")
        inputs_b = clone(inputs_a)
        ref_b, ref_b_snap, base_mut_b, base_alias_b = call(base_model, inputs_b)
    base_shared = shared_memory(ref_b, ref_a)
    del ref_a, ref_b
    result["phase"] = f"optimized, seed {seed}"
    try:
        seed_all(seed)
        opt_model, _ = model_and_inputs(opt_mod.get_model_and_input(), False)
        why = load_same_weights(base_model, opt_model)
        if why and "nn.Module" in why:
            warnings.append(why)
        elif why:
            checks.set("contract", "fail", why)
            return False
        fn, state["how"] = optimized_callable(opt_mod, opt_model)
        state["returned_model"] = state["returned_model"] or fn is opt_model
        prepare = inputs_preparer(opt_mod)
        out_a, snap_a, mut_a, alias_a = call(fn, prepare(inputs_a))
        out_b, snap_b, mut_b, alias_b = call(fn, prepare(inputs_b))
    except Exception as exc:  # noqa: BLE001 - the optimized workload's failure is a failed check
        checks.set("runs", "fail", f"seed {seed}: the optimized workload raised {refusal(exc, 300)}")
        result["optimized_traceback"] = traceback_tail(exc)
        return False
    result["phase"] = f"checks, seed {seed}"
    for name, mut, base_mut in (("a", mut_a, base_mut_a), ("b", mut_b, base_mut_b)):
        extra = [p for p in mut if p not in base_mut]
        if extra:
            checks.problem("input_mutation", f"seed {seed}, inputs {name}: the optimized workload changed "
                                             f"{', '.join(extra)} in place (the baseline does not)")
    for name, alias, base_alias in (("a", alias_a, base_alias_a), ("b", alias_b, base_alias_b)):
        extra = [p for p in alias if p not in base_alias]
        if extra:
            checks.problem("output_aliasing", f"seed {seed}, inputs {name}: {', '.join(extra)} shares memory "
                                              "with an input (the baseline's does not)")
    shared = [p for p in shared_memory(out_b, out_a) if p not in base_shared]
    if shared:
        checks.problem("output_caching", f"seed {seed}: the second call returned {', '.join(shared)} in the "
                                         "same memory as the first call's output")
    elif not _still_equal(out_a, snap_a):
        checks.problem("output_caching", f"seed {seed}: the second call overwrote the first call's output (a CUDA "
                                         "graph replays into the same memory: return a clone, as the recipes' "
                                         "workloads do after torch.compiler.cudagraph_mark_step_begin())")
    if not all_equal(ref_a_snap, ref_b_snap) and all_equal(snap_a, snap_b):
        if not within_tolerance(ref_b_snap, ref_a_snap, opts):
            checks.problem("output_caching", f"seed {seed}: different inputs gave the same output (the baseline's "
                                             "outputs differ): a result computed earlier is being returned")
        elif seed == int(result["seeds"][0]):
            warnings.append("different inputs gave the same output, but the baseline's outputs for them differ by "
                            "less than the tolerance: a result computed earlier could not be told from a fresh one "
                            "(the model's output barely depends on its input)")
    for name, snap, ref in (("a", snap_a, ref_a_snap), ("b", snap_b, ref_b_snap)):
        leaves_out, leaves_ref = flatten(snap), flatten(ref)
        if [p for p, _ in leaves_out] != [p for p, _ in leaves_ref]:
            checks.problem("shapes_dtypes", f"seed {seed}, inputs {name}: output structure "
                                            f"{[p for p, _ in leaves_out][:6]} differs from the baseline's "
                                            f"{[p for p, _ in leaves_ref][:6]}")
            continue
        for (path, out), (_, ref_leaf) in zip(leaves_out, leaves_ref, strict=True):
            max_abs, max_rel = compare_leaf(path, out, ref_leaf, seed, name, opts, checks)
            if max_abs is not None:
                extremes["abs"] = max(extremes.get("abs", 0.0), max_abs)
            if max_rel is not None:
                extremes["rel"] = max(extremes.get("rel", 0.0), max_rel)
    return True


def _still_equal(output: Any, snapshot: Any) -> bool:
    """Whether the first call's output still holds what it returned; False when reading it raises (CUDA graph trees
    refuse to read the output of a warm-up or recording call a later call overwrote; a steady-state replay's
    outputs they overwrite in silence, which the values or the shared memory show)."""
    try:
        return all_equal(output, snapshot)
    except RuntimeError as exc:
        if "overwritten" not in str(exc):
            raise
        return False


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Load both workloads and run every check; fill `result`."""
    import torch

    checks = Checks()
    warnings: list[str] = result["warnings"]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    tolerances = {**DEFAULT_TOLERANCES, **json.loads(args.tolerances)}
    flags = precision_flags()
    opts = {"tf32": False, "tolerances": tolerances, "rtol": args.rtol, "atol": args.atol,
            "reduced": args.tier != "exact"}
    result.update(tolerances=tolerances, precision_flags=flags, seeds=seeds)
    result["phase"] = "load baseline"
    base_mod = load_workload(args.baseline)
    if args.rtol is None:  # a model written in bfloat16/float16: its own distance from fp32 is the least tolerance
        _widen_for_written_precision(base_mod, seeds, tolerances, result)
    result["phase"] = "load optimized"
    try:
        opt_mod = load_workload(args.optimized)
    except BaseException as exc:  # noqa: BLE001 - reported as the contract check
        checks.set("contract", "fail", f"importing the optimized workload raised {type(exc).__name__}: {exc}")
        result["optimized_traceback"] = traceback_tail(exc)
        checks.skip_rest("the optimized workload could not be imported")
        result["checks"] = checks.as_list()
        return
    backend = _contract(opt_mod, checks)
    result["backend_name"] = getattr(opt_mod, "BACKEND_NAME", None)
    result["recipe"] = recipe_of(opt_mod)
    counter = _Counter()
    if backend is not None:
        registered = backend in torch._dynamo.list_backends(exclude_tags=())
        if not registered:
            try:
                torch._dynamo.lookup_backend(backend)
                registered = True
            except Exception:  # noqa: BLE001 - InvalidBackend
                registered = False
        if registered:
            checks.set("backend_registered", "pass", f"{backend!r} is a registered torch.compile backend")
            counter.install(backend)
        else:
            checks.set("backend_registered", "fail",
                       f"BACKEND_NAME {backend!r} is not registered: decorate the backend with "
                       "@torch._dynamo.register_backend(name=BACKEND_NAME) at import time")
    passes_before = _applied_passes(opt_mod)
    extremes: dict[str, float] = {}
    state = {"returned_model": False, "how": ""}
    if "contract" not in checks.entries:
        for seed in seeds:
            if not _one_seed(seed, base_mod, opt_mod, flags, opts, checks, extremes, state, result):
                break
    result["how_run"] = state["how"]
    result["max_abs_error"] = extremes.get("abs")
    result["max_rel_error"] = extremes.get("rel")
    after_flags = precision_flags()
    changed = {k: f"{flags[k]} -> {after_flags[k]}" for k in flags if after_flags[k] != flags[k]}
    looser = {k: v for k, v in changed.items() if loosens(k, flags[k], after_flags[k])}
    if looser:
        warnings.append(f"the optimized workload changed global precision flags {looser}: the baseline ran "
                        "with the original ones; the optimized outputs are held to the original tolerance")
    if stricter := {k: v for k, v in changed.items() if k not in looser}:
        warnings.append(f"the optimized workload set global precision flags stricter than the baseline ran with "
                        f"{stricter}: its outputs lose nothing by them, but other code in the same process runs "
                        "with them too")
    _settle(checks, counter, opt_mod, passes_before, bool(state["returned_model"]), result)


def _settle(
    checks: Checks, counter: _Counter, opt_mod: Any, passes_before: dict[str, int] | None,
    optimize_returned_model: bool, result: dict[str, Any],
) -> None:
    """Decide the checks that depend on everything having run."""
    if "contract" in checks.entries:
        checks.skip_rest("the contract check failed")
        result["checks"] = checks.as_list()
        return
    recipe = recipe_of(opt_mod)
    checks.set("contract", "pass", ("get_model_and_input, BACKEND_NAME" if recipe is None else
                                    f"get_model_and_input, RECIPE {recipe!r}") + (
        ", optimize" if callable(getattr(opt_mod, "optimize", None)) else " (no optimize(): torch.compile used)")
        + "; the baseline's state_dict loaded")
    if recipe is not None:
        why = f"the workload applies the free recipe {recipe!r} in optimize(model): no backend of its own"
        for name in ("backend_registered", "backend_invoked", "fx_passes"):
            checks.set(name, "skip", why)
    passes = _applied_passes(opt_mod)
    result["applied_passes"] = passes or {}
    result["backend_calls"] = counter.calls if counter.installed else None
    if recipe is None:
        _backend_checks(checks, counter, opt_mod, passes, passes_before, optimize_returned_model)
    if "runs" in checks.entries:
        checks.skip_rest("the optimized workload raised")
        result["checks"] = checks.as_list()
        return
    checks.set("runs", "pass", f"ran as {result.get('how_run')} on every seed and input set")
    downcast = lowered_outputs(checks)
    checks.settle("shapes_dtypes", "every output has the baseline's structure, shape, dtype and device" if not downcast
                  else "every output has the baseline's structure, shape and device; reduced tier, returned in a "
                       "lower precision than the baseline's: " + "; ".join(downcast[:5]))
    checks.settle("finite", "no NaN/Inf in any output")
    checks.settle("numerics", f"all outputs within tolerance (max abs error {result['max_abs_error'] or 0:.3g}, "
                              f"max rel error {result['max_rel_error'] or 0:.3g})")
    checks.settle("input_mutation", "no input was changed in place")
    checks.settle("output_aliasing", "no output shares memory with an input")
    checks.settle("output_caching", "each call returned fresh memory, and different inputs gave different outputs "
                                    "wherever the baseline's differ beyond the tolerance")
    result["checks"] = checks.as_list()


def _backend_checks(
    checks: Checks, counter: _Counter, opt_mod: Any, passes: dict[str, int] | None,
    passes_before: dict[str, int] | None, optimize_returned_model: bool,
) -> None:
    """backend_invoked and fx_passes, for a workload with a backend of its own."""
    filled = bool(passes) and passes != passes_before
    declared_calls = getattr(opt_mod, "BACKEND_CALLS", None)
    if counter.calls > 0:
        checks.set("backend_invoked", "pass", f"the registered backend compiled {counter.calls} graph(s) "
                                              f"({', '.join(str(n) for n in counter.graph_nodes[:5])} FX nodes)")
    elif filled or (isinstance(declared_calls, int) and declared_calls > 0):
        checks.set("backend_invoked", "pass", "the backend ran (its APPLIED_PASSES/BACKEND_CALLS changed), but not "
                                              "through the registry: pass backend=BACKEND_NAME, the string")
    elif "runs" in checks.entries:
        checks.set("backend_invoked", "skip", "not decided: the optimized workload raised before finishing")
    else:
        hint = " optimize() returned the model itself;" if optimize_returned_model else ""
        note = f" ({counter.note})" if counter.note else ""
        checks.set("backend_invoked", "fail", f"the registered backend was never called:{hint} optimize(model) "
                                              f"must return torch.compile(model, backend=BACKEND_NAME){note}")
    if passes is None:
        checks.set("fx_passes", "skip", "the workload records no APPLIED_PASSES: which passes applied is unknown")
    elif passes:
        checks.set("fx_passes", "pass", "applied: " + ", ".join(f"{k} ×{v}" for k, v in passes.items()))
    else:
        checks.set("fx_passes", "fail", "APPLIED_PASSES is empty after compilation: no FX pass changed the graph")


def main(argv: list[str] | None = None) -> int:
    """Run the validation; write the result JSON whatever happens; return the exit code."""
    args = _parse_args(argv)
    return run_main(args.out, lambda result: run(args, result), _blame)


def _blame(phase: str) -> tuple[str, str | None]:
    """What failed in `phase` and its remedy: a workload's loading or the baseline's calls, or validate's checks."""
    if phase.startswith(("load baseline", "baseline")):
        return "the baseline", "fix the baseline workload; validation needs it to run"
    if phase.startswith("load optimized"):
        return "the optimized workload", "fix the optimized workload's module: it must import and define the contract"
    return "validate", "report this with validate.log: a check raised on the workloads' outputs"


if __name__ == "__main__":
    sys.exit(main())
