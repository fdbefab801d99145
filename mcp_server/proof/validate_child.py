"""Validate child: is an optimized workload's output the baseline's? (standard library and torch only)

    python validate_child.py --baseline B.py --optimized B_optimized.py --out result.json
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

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

from _proof_child_common import (
    as_call,
    clone,
    device_of,
    flatten,
    load_same_weights,
    load_workload,
    optimized_callable,
    perturb,
    run_main,
    seed_all,
    synchronize,
    tensors,
    traceback_tail,
)

DEFAULT_TOLERANCES = {"float64": 1e-7, "float32": 1e-4, "tf32": 1e-3, "bfloat16": 1e-2, "float16": 1e-2}
CHECKS = (
    "contract", "backend_registered", "backend_invoked", "fx_passes", "runs", "shapes_dtypes", "finite",
    "numerics", "input_mutation", "output_aliasing", "output_caching",
)
MAX_EXAMPLES = 3


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler validate child")
    parser.add_argument("--baseline", required=True, type=Path)
    parser.add_argument("--optimized", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--tolerances", default="{}", help="JSON: tolerance class -> rtol")
    parser.add_argument("--rtol", type=float, default=None, help="one rtol for every floating output")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance (default: rtol x output RMS)")
    return parser.parse_args(argv)


class _Checks:
    """Check results by name, in the fixed order of CHECKS; a failure's details accumulate."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.problems: dict[str, list[str]] = {}
        self.outputs: dict[str, list[dict[str, Any]]] = {}

    def set(self, name: str, status: str, detail: str) -> None:
        self.entries[name] = {"name": name, "status": status, "passed": status != "fail", "detail": detail}

    def problem(self, name: str, text: str) -> None:
        self.problems.setdefault(name, []).append(text)

    def output(self, name: str, entry: dict[str, Any]) -> None:
        self.outputs.setdefault(name, []).append(entry)

    def settle(self, name: str, ok_detail: str) -> None:
        """Pass or fail `name` from the problems recorded for it, unless already set."""
        if name in self.entries:
            return
        found = self.problems.get(name, [])
        if found:
            more = f" (and {len(found) - MAX_EXAMPLES} more)" if len(found) > MAX_EXAMPLES else ""
            self.set(name, "fail", "; ".join(found[:MAX_EXAMPLES]) + more)
        else:
            self.set(name, "pass", ok_detail)

    def skip_rest(self, reason: str) -> None:
        for name in CHECKS:
            if name not in self.entries:
                self.set(name, "skip", f"not run: {reason}")

    def as_list(self) -> list[dict[str, Any]]:
        result = []
        for name in CHECKS:
            if name in self.entries:
                entry = dict(self.entries[name])
                entry["outputs"] = self.outputs.get(name, [])
                result.append(entry)
        return result


# --------------------------------------------------------------------------- precision and tolerance


def _precision_flags() -> dict[str, Any]:
    import torch

    flags: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    for key, owner, attr in (
        ("cuda_matmul_allow_tf32", torch.backends.cuda.matmul, "allow_tf32"),
        ("cudnn_allow_tf32", torch.backends.cudnn, "allow_tf32"),
        ("cuda_matmul_allow_fp16_reduced", torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
        ("cuda_matmul_allow_bf16_reduced", torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
    ):
        try:
            flags[key] = bool(getattr(owner, attr))
        except (AttributeError, RuntimeError):
            flags[key] = None
    return flags


def _restore_flags(flags: dict[str, Any], warnings: list[str]) -> None:
    """Put the baseline's precision flags back if optimize() changed them (so the baseline runs as it would)."""
    import torch

    current = _precision_flags()
    if current == flags:
        return
    try:
        torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
        for key, owner, attr in (
            ("cuda_matmul_allow_tf32", torch.backends.cuda.matmul, "allow_tf32"),
            ("cudnn_allow_tf32", torch.backends.cudnn, "allow_tf32"),
            ("cuda_matmul_allow_fp16_reduced", torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
            ("cuda_matmul_allow_bf16_reduced", torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
        ):
            if flags[key] is not None and current[key] != flags[key]:
                setattr(owner, attr, flags[key])
    except (AttributeError, RuntimeError) as exc:
        warnings.append(f"could not restore the baseline's precision flags: {exc}")


def _tf32_regime(flags: dict[str, Any], model: Any) -> bool:
    """Whether float32 work on a GPU may run in TF32: matmuls by their flags, convolutions by cuDNN's (on by
    default) when the model has any."""
    import torch

    if flags.get("cuda_matmul_allow_tf32") or flags.get("float32_matmul_precision") in ("high", "medium"):
        return True
    has_conv = hasattr(model, "modules") and any(
        isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()
    )
    return bool(flags.get("cudnn_allow_tf32")) and has_conv


def _tolerance_class(t: Any, tf32: bool) -> str:
    import torch

    if t.dtype in (torch.float16,):
        return "float16"
    if t.dtype == torch.bfloat16:
        return "bfloat16"
    if t.dtype in (torch.float64, torch.complex128):
        return "float64"
    if t.dtype in (torch.float32, torch.complex64):
        return "tf32" if tf32 and t.device.type == "cuda" else "float32"
    if t.is_floating_point():
        return "float16"  # float8 and other narrow types: the loosest float class
    return "exact"


# --------------------------------------------------------------------------- comparisons


def _equal(a: Any, b: Any) -> bool:
    """Exact equality, NaN equal to NaN, for tensors of the same shape/dtype (False otherwise)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(a, b) or ((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def _spans(t: Any) -> tuple[str, int, int] | None:
    try:
        storage = t.untyped_storage()
        return (str(t.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes())
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _overlaps(a: Any, b: Any) -> bool:
    sa, sb = _spans(a), _spans(b)
    if sa is None or sb is None or sa[0] != sb[0] or sa[1] == sa[2] or sb[1] == sb[2]:
        return False
    return sa[1] < sb[2] and sb[1] < sa[2]


def _compare_leaf(
    path: str, out: Any, ref: Any, seed: int, input_set: str, opts: dict[str, Any], checks: _Checks
) -> tuple[float | None, float | None]:
    """Compare one output leaf; record shape/dtype, finiteness and numerics outcomes."""
    import torch

    where = f"seed {seed}, inputs {input_set}, {path}"
    if not isinstance(ref, torch.Tensor) or not isinstance(out, torch.Tensor):
        if isinstance(ref, torch.Tensor) != isinstance(out, torch.Tensor):
            checks.problem("shapes_dtypes", f"{where}: baseline gives {type(ref).__name__}, optimized "
                                            f"{type(out).__name__}")
            return None, None
        try:
            same = bool(ref == out)
        except Exception:  # noqa: BLE001 - values that cannot be compared count as different
            same = False
        checks.output("numerics", {"seed": seed, "input_set": input_set, "output": path, "passed": bool(same),
                                   "tolerance_class": "exact", "note": f"non-tensor value {out!r} vs {ref!r}"[:200]})
        if not same:
            checks.problem("numerics", f"{where}: value {out!r} differs from the baseline's {ref!r}"[:300])
        return None, None
    if out.shape != ref.shape or out.dtype != ref.dtype or out.device != ref.device:
        checks.problem(
            "shapes_dtypes",
            f"{where}: optimized {list(out.shape)} {out.dtype} on {out.device}, baseline {list(ref.shape)} "
            f"{ref.dtype} on {ref.device}",
        )
        return None, None
    cls = _tolerance_class(ref, opts["tf32"])
    entry: dict[str, Any] = {
        "seed": seed, "input_set": input_set, "output": path, "shape": list(out.shape), "dtype": str(out.dtype),
        "tolerance_class": cls,
    }
    if out.numel() == 0:
        checks.output("numerics", {**entry, "passed": True, "note": "empty tensor"})
        return None, None
    if out.is_floating_point() or out.is_complex():
        out_finite, ref_finite = torch.isfinite(out), torch.isfinite(ref)
        bad = int((~out_finite).sum())
        if bad:
            also = " (the baseline has non-finite values too: fix the workload or its inputs)" if not bool(
                ref_finite.all()) else ""
            checks.problem("finite", f"{where}: {bad} of {out.numel()} values are NaN/Inf{also}")
        both = out_finite & ref_finite
        a = out.detach().to(torch.complex128 if out.is_complex() else torch.float64)
        b = ref.detach().to(torch.complex128 if ref.is_complex() else torch.float64)
        diff = (a - b).abs()[both]
        mag = b.abs()[both]
        rtol = opts["rtol"] if opts["rtol"] is not None else opts["tolerances"][cls]
        rms = float(mag.pow(2).mean().sqrt()) if mag.numel() else 0.0
        atol = opts["atol"] if opts["atol"] is not None else rtol * max(rms, 1e-12)
        nonfinite_out, nonfinite_ref = ~out_finite, ~ref_finite
        same_nonfinite = bool((nonfinite_out == nonfinite_ref).all())
        if same_nonfinite and bool(nonfinite_out.any()):
            x, y = out[nonfinite_out], ref[nonfinite_ref]
            same_nonfinite = bool(((x == y) | (x.isnan() & y.isnan())).all())
        scale = atol / rtol if rtol > 0 else max(rms, 1e-12)
        if diff.numel():
            max_abs = float(diff.max())
            max_rel = float((diff / (mag + scale)).max())
            within = bool((diff <= atol + rtol * mag).all())
        else:
            max_abs, max_rel, within = 0.0, 0.0, True
        passed = within and same_nonfinite
        entry.update(max_abs_error=max_abs, max_rel_error=max_rel, rtol=rtol, atol=atol, passed=passed)
        if not same_nonfinite:
            entry["note"] = "NaN/Inf positions differ from the baseline's"
        checks.output("numerics", entry)
        if not passed:
            checks.problem(
                "numerics",
                f"{where}: max abs error {max_abs:.3g}, max rel error {max_rel:.3g} > rtol {rtol:g} "
                f"(atol {atol:.3g}, {cls})" + ("; NaN/Inf positions differ" if not same_nonfinite else ""),
            )
        return max_abs, max_rel
    mismatched = int((out != ref).sum())
    max_abs = float((out.double() - ref.double()).abs().max()) if out.dtype != torch.bool else float(mismatched > 0)
    entry.update(max_abs_error=max_abs, max_rel_error=None, passed=mismatched == 0,
                 note=None if mismatched == 0 else f"{mismatched} elements differ")
    checks.output("numerics", entry)
    if mismatched:
        checks.problem("numerics", f"{where}: {mismatched} of {out.numel()} {out.dtype} elements differ (exact)")
    return max_abs, None


def _mutated(before: Any, after: Any) -> list[str]:
    """Paths of input tensors whose values changed."""
    import torch

    return [path for (path, b), (_, a) in zip(flatten(before, "input"), flatten(after, "input"), strict=True)
            if isinstance(b, torch.Tensor) and not _equal(a, b)]


def _aliased(outputs: Any, inputs: Any) -> list[str]:
    """Paths of output tensors sharing memory with an input tensor."""
    ins = tensors(inputs)
    return [path for path, leaf in _tensor_leaves(outputs) if any(_overlaps(leaf, x) for x in ins)]


def _tensor_leaves(obj: Any) -> list[tuple[str, Any]]:
    import torch

    return [(path, leaf) for path, leaf in flatten(obj) if isinstance(leaf, torch.Tensor)]


def _shared_memory(later: Any, earlier: Any) -> list[str]:
    """Paths of `later`'s tensors sharing memory with a tensor of `earlier`."""
    old = tensors(earlier)
    return [path for path, leaf in _tensor_leaves(later) if any(_overlaps(leaf, x) for x in old)]


def _call(fn: Any, inputs: Any) -> tuple[Any, Any, list[str], list[str]]:
    """Call `fn` on a private copy of `inputs`: (output, output snapshot, mutated inputs, aliased outputs)."""
    import torch

    passed = clone(inputs)
    args, kwargs = as_call(passed)
    with torch.no_grad():
        out = fn(*args, **kwargs)
    synchronize()
    return out, clone(out), _mutated(inputs, passed), _aliased(out, passed)


def _all_equal(a: Any, b: Any) -> bool:
    la, lb = flatten(a), flatten(b)
    if len(la) != len(lb):
        return False
    import torch

    for (_, x), (_, y) in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if not _equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True


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


def _contract(opt_mod: Any, checks: _Checks) -> str | None:
    """Check the optimized module's interface; return its BACKEND_NAME (None when the contract is broken)."""
    problems = []
    if not callable(getattr(opt_mod, "get_model_and_input", None)):
        problems.append("no callable get_model_and_input()")
    backend = getattr(opt_mod, "BACKEND_NAME", None)
    if not isinstance(backend, str) or not backend:
        problems.append("no module-level BACKEND_NAME string naming its torch.compile backend")
    optimize = getattr(opt_mod, "optimize", None)
    if optimize is not None and not callable(optimize):
        problems.append("optimize is not callable")
    if problems:
        checks.set("contract", "fail", "the optimized workload has " + "; ".join(problems))
        return None
    return backend


def _one_seed(
    seed: int, base_mod: Any, opt_mod: Any, flags: dict[str, Any], opts: dict[str, Any], checks: _Checks,
    extremes: dict[str, float], state: dict[str, Any], result: dict[str, Any],
) -> bool:
    """Run baseline and optimized on one seed's two input sets and record every comparison; False stops."""
    warnings: list[str] = result["warnings"]
    _restore_flags(flags, warnings)
    result["phase"] = f"baseline, seed {seed}"
    seed_all(seed)
    base_model, inputs_a = base_mod.get_model_and_input()
    call_args, call_kwargs = as_call(inputs_a)
    opts["tf32"] = _tf32_regime(flags, base_model) and device_of(base_model, call_args, call_kwargs) == "cuda"
    result["tf32"] = opts["tf32"]
    inputs_b = perturb(inputs_a, 7919 * (seed + 1))
    if getattr(base_model, "training", False) and seed == int(result["seeds"][0]):
        warnings.append("the baseline model is in training mode: dropout or batch statistics make outputs vary")
    ref_a, ref_a_snap, base_mut_a, base_alias_a = _call(base_model, inputs_a)
    ref_b, ref_b_snap, base_mut_b, base_alias_b = _call(base_model, inputs_b)
    base_shared = _shared_memory(ref_b, ref_a)
    del ref_a, ref_b
    result["phase"] = f"optimized, seed {seed}"
    try:
        seed_all(seed)
        opt_model, _ = opt_mod.get_model_and_input()
        why = load_same_weights(base_model, opt_model)
        if why and "nn.Module" in why:
            warnings.append(why)
        elif why:
            checks.set("contract", "fail", why)
            return False
        fn, state["how"] = optimized_callable(opt_mod, opt_model)
        state["returned_model"] = state["returned_model"] or fn is opt_model
        out_a, snap_a, mut_a, alias_a = _call(fn, inputs_a)
        out_b, snap_b, mut_b, alias_b = _call(fn, inputs_b)
    except Exception as exc:  # noqa: BLE001 - the optimized workload's failure is a failed check
        first = str(exc).splitlines()[0] if str(exc) else ""
        checks.set("runs", "fail", f"seed {seed}: the optimized workload raised {type(exc).__name__}: {first}")
        result["optimized_traceback"] = traceback_tail(exc)
        return False
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
    shared = [p for p in _shared_memory(out_b, out_a) if p not in base_shared]
    if shared:
        checks.problem("output_caching", f"seed {seed}: the second call returned {', '.join(shared)} in the "
                                         "same memory as the first call's output")
    elif not _all_equal(out_a, snap_a):
        checks.problem("output_caching", f"seed {seed}: the second call overwrote the first call's output")
    if not _all_equal(ref_a_snap, ref_b_snap) and _all_equal(snap_a, snap_b):
        checks.problem("output_caching", f"seed {seed}: different inputs gave the same output (the baseline's "
                                         "outputs differ): a result computed earlier is being returned")
    for name, snap, ref in (("a", snap_a, ref_a_snap), ("b", snap_b, ref_b_snap)):
        leaves_out, leaves_ref = flatten(snap), flatten(ref)
        if [p for p, _ in leaves_out] != [p for p, _ in leaves_ref]:
            checks.problem("shapes_dtypes", f"seed {seed}, inputs {name}: output structure "
                                            f"{[p for p, _ in leaves_out][:6]} differs from the baseline's "
                                            f"{[p for p, _ in leaves_ref][:6]}")
            continue
        for (path, out), (_, ref_leaf) in zip(leaves_out, leaves_ref, strict=True):
            max_abs, max_rel = _compare_leaf(path, out, ref_leaf, seed, name, opts, checks)
            if max_abs is not None:
                extremes["abs"] = max(extremes.get("abs", 0.0), max_abs)
            if max_rel is not None:
                extremes["rel"] = max(extremes.get("rel", 0.0), max_rel)
    return True


def run(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Load both workloads and run every check; fill `result`."""
    import torch

    checks = _Checks()
    warnings: list[str] = result["warnings"]
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    tolerances = {**DEFAULT_TOLERANCES, **json.loads(args.tolerances)}
    flags = _precision_flags()
    opts = {"tf32": False, "tolerances": tolerances, "rtol": args.rtol, "atol": args.atol}
    result.update(tolerances=tolerances, precision_flags=flags, seeds=seeds)
    result["phase"] = "load baseline"
    base_mod = load_workload(args.baseline)
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
    after_flags = _precision_flags()
    if after_flags != flags:
        changed = {k: f"{flags[k]} -> {after_flags[k]}" for k in flags if after_flags[k] != flags[k]}
        warnings.append(f"the optimized workload changed global precision flags {changed}: the baseline ran "
                        "with the original ones; the optimized outputs are held to the original tolerance")
    _settle(checks, counter, opt_mod, passes_before, bool(state["returned_model"]), result)


def _settle(
    checks: _Checks, counter: _Counter, opt_mod: Any, passes_before: dict[str, int] | None,
    optimize_returned_model: bool, result: dict[str, Any],
) -> None:
    """Decide the checks that depend on everything having run."""
    if "contract" in checks.entries:
        checks.skip_rest("the contract check failed")
        result["checks"] = checks.as_list()
        return
    checks.set("contract", "pass", "get_model_and_input, BACKEND_NAME" + (
        ", optimize" if callable(getattr(opt_mod, "optimize", None)) else " (no optimize(): torch.compile used)")
        + "; the baseline's state_dict loaded")
    passes = _applied_passes(opt_mod)
    result["applied_passes"] = passes or {}
    result["backend_calls"] = counter.calls if counter.installed else None
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
    if "runs" in checks.entries:
        checks.skip_rest("the optimized workload raised")
        result["checks"] = checks.as_list()
        return
    checks.set("runs", "pass", f"ran as {result.get('how_run')} on every seed and input set")
    checks.settle("shapes_dtypes", "every output has the baseline's structure, shape, dtype and device")
    checks.settle("finite", "no NaN/Inf in any output")
    checks.settle("numerics", f"all outputs within tolerance (max abs error {result['max_abs_error'] or 0:.3g}, "
                              f"max rel error {result['max_rel_error'] or 0:.3g})")
    checks.settle("input_mutation", "no input was changed in place")
    checks.settle("output_aliasing", "no output shares memory with an input")
    checks.settle("output_caching", "each call returned fresh memory, and different inputs gave different outputs")
    result["checks"] = checks.as_list()


def main(argv: list[str] | None = None) -> int:
    """Run the validation; write the result JSON whatever happens; return the exit code."""
    args = _parse_args(argv)
    return run_main(
        args.out, lambda result: run(args, result), "the baseline",
        "fix the baseline workload; validation needs it to run",
    )


if __name__ == "__main__":
    sys.exit(main())
