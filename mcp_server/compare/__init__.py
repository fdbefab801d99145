"""Compare an optimized profile.json against its baseline: per-operator, per-module and per-kernel deltas.

Operators are tied across the two profiles in steps, so identity survives fusion and renaming:

1. same (operator_name, module_path) and the same call order within that pair; then, for unfused operators left
   on both sides, the same module path and operator family in call order ('renamed': `aten::conv2d` eager is
   `aten::convolution` compiled, `aten::linear` becomes `aten::addmm`, `aten::relu_` is `aten::relu`);
2. an optimized fused operator (`is_fused`, Inductor) absorbs still unmatched baseline operators whose operator
   family is in its `fused_operators`: first within its own module subtree, deepest module paths first; one
   that found nothing there widens to its parent's subtree, level by level (Inductor reuses one kernel for
   identical sibling blocks and names the first block's module for every call);
3. the baseline operators still unmatched go by module path alone to the deepest fused operator whose module
   path is theirs or above it.

What is left is `appeared` (optimized only: new casts, replacement ops) or `disappeared` (baseline only).
GPU profiles are compared on kernel time; CPU-only profiles (no kernels) on the operators' CPU times.
Speedups here come from profiles (sums of kernel durations), not from wall-clock runs: a report's speedup
comes from `bench`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from mcp_server.compare.matching import (
    COUNTERS,
    Matching,
    gpu_basis,
    module_label,
    normalize_op_name,
    op_dram,
    op_family,
    op_kernel_count,
    op_module_time,
    operator_metrics,
    profile_summary,
    ratio,
    speedup,
    sum_optional,
)
from mcp_server.errors import ProfilerError
from mcp_server.schema.io import load_profile
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord
from mcp_server.schema.proof import (
    Comparison,
    KernelDelta,
    ModuleDelta,
    OperatorDelta,
    TotalDelta,
)

COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
UNATTRIBUTED = "<unattributed>"
MISMATCH_REMEDY = "pass --allow-mismatch to compare anyway"
CAST_OPS = frozenset(
    {"aten::to", "aten::_to_copy", "aten::copy_", "aten::type_as", "aten::_autocast_to_reduced_precision",
     "aten::_autocast_to_full_precision", "aten::contiguous", "aten::clone"}
)
MAX_MISMATCH_EXAMPLES = 3
SHAPE_UNSAFE_FAMILIES = frozenset({"aten::linear"})
# Decomposed or compiled spellings of an eager operator (after overload and in-place suffixes are dropped).


class ProfileMismatch(ProfilerError):
    """The two profiles are not like for like (device, input shapes, run mode or iteration count)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("refusing to compare: " + "; ".join(reasons), MISMATCH_REMEDY)
        self.reasons = reasons


# --------------------------------------------------------------------------- mismatch checks


def _first_input_shape(op: OperatorRecord) -> list[int] | None:
    if not op.input_shapes:
        return None
    return op.input_shapes[0]


def _shape_mismatches(matching: Matching) -> list[str]:
    """Per module path, the first matched operator's first input (the activation entering the module).

    Exact matches count, and renamed ones whose spellings take the same arguments (not `aten::linear` against
    `aten::addmm`, whose first argument is the bias).
    """
    seen_modules: set[str | None] = set()
    found = []
    for j in sorted(matching.pairs):
        rule = matching.rules[j]
        opt = matching.optimized[j]
        if rule not in ("name_module_order", "renamed") or opt.module_path in seen_modules:
            continue
        base = matching.baseline[matching.pairs[j][0]]
        if rule == "renamed" and op_family(opt.operator_name) in SHAPE_UNSAFE_FAMILIES:
            continue
        base_shape, opt_shape = _first_input_shape(base), _first_input_shape(opt)
        if base_shape is None or opt_shape is None:
            continue
        seen_modules.add(opt.module_path)
        if base_shape != opt_shape:
            found.append(f"{module_label(opt.module_path)} ({opt.operator_name}): {base_shape} vs {opt_shape}")
    return found


UNATTRIBUTED_SHARE = 0.5  # above this share of kernel time unattributed, the optimized side's operators are few


def _why_unmatched(baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile) -> str:
    """The likely reason no operator pairs: most of the optimized profile's kernel time unattributed, or two models."""
    lost = optimized.unattributed_kernel_time_ns()
    total = optimized.window.kernel_time_ns
    if total and lost / total > UNATTRIBUTED_SHARE:
        return (f"{100.0 * lost / total:.1f} % of the optimized profile's kernel time is in "
                f"{len(optimized.unattributed_kernels)} kernels no operator range encloses (a CUDA graph the workload "
                "captures and replays itself, or launches outside annotated code), so its operators cannot pair; "
                "the totals and the kernels still compare")
    names = Path(baseline.capture_metadata.workload).name, Path(optimized.capture_metadata.workload).name
    return f"these look like different models ({names[0]} and {names[1]})"


def find_mismatches(
    baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile, matching: Matching | None = None
) -> list[str]:
    """Why two profiles are not like for like: device, run mode, iteration count, no operator in common, input
    shapes. Empty if they are."""
    b, o = baseline.capture_metadata, optimized.capture_metadata
    reasons = []
    if b.gpu_used != o.gpu_used or b.device_type != o.device_type:
        reasons.append(
            f"different devices: baseline ran on {b.device_type} (GPU used: {b.gpu_used}), "
            f"optimized on {o.device_type} (GPU used: {o.gpu_used})"
        )
    elif b.device_name and o.device_name and b.device_name != o.device_name:
        reasons.append(f"different devices: baseline ran on {b.device_name!r}, optimized on {o.device_name!r}")
    if b.run_mode != o.run_mode:
        reasons.append(f"different run modes: baseline {b.run_mode!r}, optimized {o.run_mode!r}")
    if b.iters != o.iters:
        reasons.append(f"different measured iteration counts: baseline {b.iters}, optimized {o.iters}")
    matching = matching or Matching(baseline.operators, optimized.operators)
    if baseline.operators and optimized.operators and not matching.taken:
        reasons.append(
            "no operator of the baseline has a counterpart in the optimized profile (by name, spelling, module or "
            f"fusion): {_why_unmatched(baseline, optimized)}"
        )
    shapes = _shape_mismatches(matching)
    if shapes:
        more = f" and {len(shapes) - MAX_MISMATCH_EXAMPLES} more" if len(shapes) > MAX_MISMATCH_EXAMPLES else ""
        reasons.append(
            "different input shapes at " + "; ".join(shapes[:MAX_MISMATCH_EXAMPLES]) + more
            + " (baseline vs optimized)"
        )
    return reasons


# --------------------------------------------------------------------------- deltas


def _operator_deltas(matching: Matching, gpu: bool) -> list[OperatorDelta]:
    deltas = []
    for j, opt in enumerate(matching.optimized):
        name, module, order = matching.opt_keys[j]
        opt_metrics = operator_metrics([opt], gpu)
        base_indices = matching.pairs.get(j, [])
        if not base_indices:
            deltas.append(OperatorDelta(
                status="appeared", match_rule="none", operator_name=name, module_path=module, call_order=order,
                optimized_operator_ids=[opt.operator_id], optimized=opt_metrics, time_delta_ns=opt_metrics.time_ns,
            ))
            continue
        base_ops = [matching.baseline[i] for i in base_indices]
        base_metrics = operator_metrics(base_ops, gpu)
        rule = matching.rules[j]
        deltas.append(OperatorDelta(
            status="matched" if rule in ("name_module_order", "renamed", "name_order") else "fused",
            match_rule=rule,  # type: ignore[arg-type]
            operator_name=name, module_path=module, call_order=order,
            baseline_operator_ids=[op.operator_id for op in base_ops],
            optimized_operator_ids=[opt.operator_id],
            absorbed_operators=[op.operator_name for op in base_ops] if rule.startswith("fused") else [],
            baseline=base_metrics, optimized=opt_metrics,
            time_delta_ns=opt_metrics.time_ns - base_metrics.time_ns,
            time_ratio=ratio(opt_metrics.time_ns, base_metrics.time_ns),
        ))
    for i, base in enumerate(matching.baseline):
        if i in matching.taken:
            continue
        name, module, order = matching.base_keys[i]
        base_metrics = operator_metrics([base], gpu)
        deltas.append(OperatorDelta(
            status="disappeared", match_rule="none", operator_name=name, module_path=module, call_order=order,
            baseline_operator_ids=[base.operator_id], baseline=base_metrics, time_delta_ns=-base_metrics.time_ns,
        ))
    return deltas


def _module_rows(profile: OperatorAttributedProfile, gpu: bool) -> dict[str, dict[str, float | int | None]]:
    rows: dict[str, dict[str, float | int | None]] = {}
    for op in profile.operators:
        row = rows.setdefault(module_label(op.module_path), {"time": 0, "kernels": 0, "ops": 0, "dram": None})
        row["time"] = int(row["time"] or 0) + op_module_time(op, gpu)
        row["kernels"] = int(row["kernels"] or 0) + op_kernel_count(op)
        row["ops"] = int(row["ops"] or 0) + 1
        dram = op_dram(op)
        if dram is not None:
            row["dram"] = float(row["dram"] or 0.0) + dram
    if gpu and profile.unattributed_kernels:
        rows[UNATTRIBUTED] = {
            "time": sum(k.duration_ns for k in profile.unattributed_kernels),
            "kernels": len(profile.unattributed_kernels), "ops": 0, "dram": None,
        }
    return rows


def _module_deltas(
    baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile, gpu: bool
) -> list[ModuleDelta]:
    base_rows, opt_rows = _module_rows(baseline, gpu), _module_rows(optimized, gpu)
    empty = {"time": 0, "kernels": 0, "ops": 0, "dram": None}
    deltas = []
    for path in dict.fromkeys([*base_rows, *opt_rows]):
        b, o = base_rows.get(path, empty), opt_rows.get(path, empty)
        b_time, o_time = int(b["time"] or 0), int(o["time"] or 0)
        deltas.append(ModuleDelta(
            module_path=path, baseline_time_ns=b_time, optimized_time_ns=o_time, time_delta_ns=o_time - b_time,
            time_ratio=ratio(o_time, b_time),
            baseline_kernel_count=int(b["kernels"] or 0), optimized_kernel_count=int(o["kernels"] or 0),
            baseline_operator_count=int(b["ops"] or 0), optimized_operator_count=int(o["ops"] or 0),
            baseline_dram_bytes=b["dram"], optimized_dram_bytes=o["dram"],
        ))
    return deltas


def _all_kernels(profile: OperatorAttributedProfile) -> list[KernelRecord]:
    return [k for op in profile.operators for k in op.kernels] + list(profile.unattributed_kernels)


def _kernel_deltas(baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile) -> list[KernelDelta]:
    tallies: dict[str, list[int]] = {}
    for side, profile in ((0, baseline), (1, optimized)):
        for kernel in _all_kernels(profile):
            tally = tallies.setdefault(kernel.kernel_name, [0, 0, 0, 0])
            tally[side] += 1
            tally[2 + side] += kernel.duration_ns
    deltas = []
    for name, (b_count, o_count, b_time, o_time) in tallies.items():
        status: Literal["appeared", "disappeared", "changed", "unchanged"]
        if b_count == 0:
            status = "appeared"
        elif o_count == 0:
            status = "disappeared"
        elif b_count != o_count:
            status = "changed"
        else:
            status = "unchanged"
        deltas.append(KernelDelta(
            kernel_name=name, status=status, baseline_count=b_count, optimized_count=o_count,
            baseline_time_ns=b_time, optimized_time_ns=o_time,
        ))
    deltas.sort(key=lambda d: -(d.baseline_time_ns + d.optimized_time_ns))
    return deltas


def _total(name: str, baseline: float | None, optimized: float | None, is_time: bool) -> TotalDelta:
    delta = optimized - baseline if baseline is not None and optimized is not None else None
    return TotalDelta(
        name=name, baseline=baseline, optimized=optimized, delta=delta, ratio=ratio(optimized, baseline),
        speedup=speedup(baseline, optimized) if is_time else None,
    )


def _cpu_time(profile: OperatorAttributedProfile) -> int | None:
    if profile.window.cpu_operator_time_ns is not None:
        return profile.window.cpu_operator_time_ns
    total = sum_optional(op_module_time(op, False) for op in profile.operators)
    return int(total) if total is not None else None


def _totals(baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile, gpu: bool) -> list[TotalDelta]:
    b, o = baseline.window, optimized.window
    totals = []
    if gpu:
        totals += [
            _total("gpu_kernel_time_ns", b.kernel_time_ns, o.kernel_time_ns, True),
            _total("gpu_busy_time_ns", b.gpu_busy_time_ns, o.gpu_busy_time_ns, True),
            _total("gpu_elapsed_ns", b.gpu_elapsed_ns, o.gpu_elapsed_ns, True),
            _total("kernel_count", b.kernel_count, o.kernel_count, False),
            _total(
                "unattributed_kernel_time_ns",
                baseline.unattributed_kernel_time_ns(),
                optimized.unattributed_kernel_time_ns(),
                True,
            ),
        ]
        dram_b = sum_optional(op_dram(op) for op in baseline.operators)
        dram_o = sum_optional(op_dram(op) for op in optimized.operators)
        if dram_b is not None or dram_o is not None:
            totals.append(_total("dram_bytes", dram_b, dram_o, False))
    else:
        totals.append(_total("cpu_operator_time_ns", _cpu_time(baseline), _cpu_time(optimized), True))
    totals += [
        _total("window_wall_time_ns", b.wall_time_ns, o.wall_time_ns, True),
        _total(
            "window_wall_time_per_iter_ns",
            b.wall_time_ns / max(baseline.capture_metadata.iters, 1),
            o.wall_time_ns / max(optimized.capture_metadata.iters, 1),
            True,
        ),
        _total("operator_count", len(baseline.operators), len(optimized.operators), False),
    ]
    return [t for t in totals if t.baseline or t.optimized]


# --------------------------------------------------------------------------- public API


def compare_profiles(
    baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile, allow_mismatch: bool = False
) -> Comparison:
    """Compare two profiles; raise ProfileMismatch (a ProfilerError) when they are not like for like.

    With `allow_mismatch` the comparison is made anyway and the reasons are kept in `mismatches`.
    """
    matching = Matching(baseline.operators, optimized.operators)
    reasons = find_mismatches(baseline, optimized, matching)
    if reasons and not allow_mismatch:
        raise ProfileMismatch(reasons)
    gpu = gpu_basis(baseline, optimized)
    operators = _operator_deltas(matching, gpu)
    counts = {status: 0 for status in ("matched", "fused", "appeared", "disappeared")}
    for delta in operators:
        counts[delta.status] += 1
    new_casts = [
        f"{d.operator_name} at {module_label(d.module_path)} (call {d.call_order})"
        for d in operators
        if d.status == "appeared" and normalize_op_name(d.operator_name) in CAST_OPS
    ]
    warnings = []
    if not gpu and (baseline.capture_metadata.gpu_used or optimized.capture_metadata.gpu_used):
        warnings.append("one profile has GPU kernels and the other none: compared on CPU operator time")
    b_meta, o_meta = baseline.capture_metadata, optimized.capture_metadata
    if gpu and not (b_meta.device_name and o_meta.device_name):
        warnings.append("a profile records no device name: could not check both ran on the same GPU")
    if b_meta.torch_version != o_meta.torch_version:
        warnings.append(f"different torch versions: {b_meta.torch_version} vs {o_meta.torch_version}")
    return Comparison(
        time_basis="gpu_kernel_time" if gpu else "cpu_time",
        baseline=profile_summary(baseline), optimized=profile_summary(optimized),
        allow_mismatch=allow_mismatch, mismatches=reasons,
        totals=_totals(baseline, optimized, gpu),
        match_counts=counts,
        operators=operators,
        modules=_module_deltas(baseline, optimized, gpu),
        kernels=_kernel_deltas(baseline, optimized) if gpu else [],
        new_casts=new_casts,
        warnings=warnings,
    )


def compare_paths(baseline: Path, optimized: Path, allow_mismatch: bool = False) -> Comparison:
    """Load two profile.json files and compare them (the CLI/MCP entry point)."""
    comparison = compare_profiles(load_profile(baseline), load_profile(optimized), allow_mismatch)
    comparison.baseline.path = str(Path(baseline).resolve())
    comparison.optimized.path = str(Path(optimized).resolve())
    return comparison


def total(comparison: Comparison, name: str) -> TotalDelta | None:
    """The named window total of a comparison, or None."""
    return next((t for t in comparison.totals if t.name == name), None)


__all__ = [
    "COMPARISON_JSON", "COMPARISON_MD", "COUNTERS", "ProfileMismatch", "compare_paths", "compare_profiles",
    "find_mismatches", "module_label", "normalize_op_name", "op_family", "speedup", "total",
]
