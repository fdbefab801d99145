"""Numerical comparison for the validate child: precision flags and their tolerance regimes, dtype-aware
closeness of output leaves, input mutation and output aliasing (standard library and torch only)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mcp_server.children.common import as_call, clone, flatten, map_tensors, refusal, synchronize, tensors

CHECKS = (
    "contract", "backend_registered", "backend_invoked", "fx_passes", "runs", "shapes_dtypes", "finite",
    "numerics", "input_mutation", "output_aliasing", "output_caching",
)
MAX_EXAMPLES = 3


class Checks:
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


_MATMUL_PRECISION = ("highest", "high", "medium")  # torch.set_float32_matmul_precision, most precise first


def loosens(flag: str, before: Any, after: Any) -> bool:
    """Whether changing `precision_flags()` entry `flag` from `before` to `after` lowers precision: an `allow_*`
    switched on, or a float32 matmul precision below the one before."""
    if flag == "float32_matmul_precision":
        rank = {p: i for i, p in enumerate(_MATMUL_PRECISION)}
        return rank.get(str(after), 0) > rank.get(str(before), 0)
    return bool(after) and not before


def precision_flags() -> dict[str, Any]:
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


def restore_flags(flags: dict[str, Any], warnings: list[str]) -> None:
    """Put the baseline's precision flags back if optimize() changed them (so the baseline runs as it would)."""
    import torch

    current = precision_flags()
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


def tf32_regime(flags: dict[str, Any], model: Any) -> bool:
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


def _tolerance(mag: Any, cls: str, opts: dict[str, Any]) -> tuple[float, float, float]:
    """(rtol, atol, rms) for a reference of magnitudes `mag` in tolerance class `cls`: atol is rtol times the
    reference's root mean square unless given."""
    rtol = opts["rtol"] if opts["rtol"] is not None else opts["tolerances"][cls]
    rms = float(mag.pow(2).mean().sqrt()) if mag.numel() else 0.0
    atol = opts["atol"] if opts["atol"] is not None else rtol * max(rms, 1e-12)
    return rtol, atol, rms


def within_tolerance(a: Any, b: Any, opts: dict[str, Any]) -> bool:
    """Whether every floating-point leaf of `a` is within the tolerance of `b`'s as `compare_leaf` judges it (other
    leaves: equal), `b` the reference."""
    import torch

    la, lb = flatten(a), flatten(b)
    if [p for p, _ in la] != [p for p, _ in lb]:
        return False
    for (_, x), (_, y) in zip(la, lb, strict=True):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.is_floating_point()
                and y.is_floating_point() and x.shape == y.shape):
            if not all_equal(x, y):
                return False
            continue
        finite = torch.isfinite(x) & torch.isfinite(y)
        diff, mag = (x.double() - y.double()).abs()[finite], y.double().abs()[finite]
        rtol, atol, _ = _tolerance(mag, _tolerance_class(y, opts["tf32"]), opts)
        if not bool((diff <= atol + rtol * mag).all()):
            return False
    return True


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


PERCENTILES = (50, 90, 99, 99.9)
QUANTILE_SAMPLE = 1 << 20  # elements torch.quantile sees: an evenly strided sample of larger outputs


def error_percentiles(rel: Any) -> dict[str, float]:
    """p50/p90/p99/p99.9 of an output's relative errors (an evenly strided sample above QUANTILE_SAMPLE
    elements): the error distribution, not only its maximum."""
    import torch

    flat = rel.reshape(-1)
    if flat.numel() > QUANTILE_SAMPLE:
        flat = flat[:: -(-flat.numel() // QUANTILE_SAMPLE)]
    levels = torch.tensor([p / 100 for p in PERCENTILES], dtype=flat.dtype, device=flat.device)
    values = torch.quantile(flat, levels)
    return {f"p{p:g}": float(v) for p, v in zip(PERCENTILES, values.tolist(), strict=True)}


REDUCED_OUTPUT_DTYPES = ("bfloat16", "float16")


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def lowered_outputs(checks: Checks) -> list[str]:
    """Outputs returned in a lower precision than the baseline's (reduced tier), once each, in the order seen."""
    seen = {f"{e['output']} {_name(e['dtype'])} (baseline {_name(e['baseline_dtype'])})": None
            for e in checks.outputs.get("numerics", []) if e.get("baseline_dtype")}
    return list(seen)


def _dtype_allowed(out: Any, ref: Any, opts: dict[str, Any]) -> bool:
    """The baseline's dtype, or in the reduced tier a floating output returned in bfloat16/float16 (from float32 or
    float64, or one half precision for the other: a bfloat16 model cast to float16)."""
    if out.dtype == ref.dtype:
        return True
    return bool(opts.get("reduced")) and _name(ref.dtype) in ("float32", "float64", *REDUCED_OUTPUT_DTYPES) and (
        _name(out.dtype) in REDUCED_OUTPUT_DTYPES)


def written_below_fp32(model: Any) -> bool:
    """Whether `model` is an nn.Module with parameters in bfloat16 or float16 (a model loaded in half precision)."""
    import torch

    return isinstance(model, torch.nn.Module) and any(
        _name(p.dtype) in REDUCED_OUTPUT_DTYPES for p in model.parameters())


def upcast(obj: Any) -> Any:
    """`obj` with every floating tensor in it as float32 (tuples, lists and dicts rebuilt)."""
    return map_tensors(lambda t: t.float() if t.is_floating_point() else t, obj)


@contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for matmuls and cuDNN while the reference runs; the flags as they were afterwards."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def written_error(build: Callable[[int], tuple[Any, Any]], seeds: list[int], opts: dict[str, Any]
                  ) -> dict[str, Any] | None:
    """How far a model written in bfloat16/float16 is from itself in float32 (parameters, buffers and floating
    inputs upcast, TF32 off), on every seed's model and inputs from `build(seed)`: its outputs compared as a recipe's
    are (`opts`), as {seeds, outputs, problems}. Two implementations of such a model (eager and compiled, say) may
    fairly differ by twice this. None for a model written in float32, or no nn.Module; a model that cannot run in
    float32 (a kernel only for half precision) gives no outputs and says why (`failed`)."""
    import torch

    checks = Checks()
    for seed in seeds:
        model, inputs = build(seed)
        if not written_below_fp32(model):
            return None
        with torch.no_grad(), exact_fp32():
            args, kwargs = as_call(inputs)
            written = [(p, t.detach().cpu() if isinstance(t, torch.Tensor) else t)
                       for p, t in flatten(model(*args, **kwargs))]
            twin = copy.deepcopy(model)  # upcast a copy: a workload may hand out one model it keeps
            del model
            try:
                truth = [(p, t.detach().cpu() if isinstance(t, torch.Tensor) else t)
                         for p, t in flatten(twin.float()(*upcast(args), **upcast(kwargs)))]
            except Exception as exc:  # noqa: BLE001 - the model runs only as written: no floor is measured
                return {"seeds": seeds, "outputs": [], "problems": {},
                        "failed": refusal(exc, 200)}
            finally:
                del twin
        for (path, out), (_, ref) in zip(written, truth, strict=True):
            compare_leaf(path, out, ref, seed, "a", opts, checks)
    return {"seeds": seeds, "outputs": checks.outputs.get("numerics", []),
            "problems": {k: v for k, v in checks.problems.items() if k != "numerics"}}


def compare_leaf(
    path: str, out: Any, ref: Any, seed: int, input_set: str, opts: dict[str, Any], checks: Checks
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
    if out.shape != ref.shape or not _dtype_allowed(out, ref, opts) or out.device != ref.device:
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
    if out.dtype != ref.dtype:
        entry["baseline_dtype"] = str(ref.dtype)
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
        rtol, atol, rms = _tolerance(mag, cls, opts)
        nonfinite_out, nonfinite_ref = ~out_finite, ~ref_finite
        same_nonfinite = bool((nonfinite_out == nonfinite_ref).all())
        if same_nonfinite and bool(nonfinite_out.any()):
            x, y = out[nonfinite_out], ref[nonfinite_ref]
            same_nonfinite = bool(((x == y) | (x.isnan() & y.isnan())).all())
        scale = atol / rtol if rtol > 0 else max(rms, 1e-12)
        if diff.numel():
            rel = (diff / (mag + scale)).real
            max_abs = float(diff.max())
            max_rel = float(rel.max())
            within = bool((diff <= atol + rtol * mag).all())
            entry["rel_error_percentiles"] = error_percentiles(rel)
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


def shared_memory(later: Any, earlier: Any) -> list[str]:
    """Paths of `later`'s tensors sharing memory with a tensor of `earlier`."""
    old = tensors(earlier)
    return [path for path, leaf in _tensor_leaves(later) if any(_overlaps(leaf, x) for x in old)]


def call(fn: Any, inputs: Any) -> tuple[Any, Any, list[str], list[str]]:
    """Call `fn` on a private copy of `inputs`: (output, output snapshot, mutated inputs, aliased outputs)."""
    import torch

    passed = clone(inputs)
    args, kwargs = as_call(passed)
    with torch.no_grad():
        out = fn(*args, **kwargs)
    synchronize()
    return out, clone(out), _mutated(inputs, passed), _aliased(out, passed)


def all_equal(a: Any, b: Any) -> bool:
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
