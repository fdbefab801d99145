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

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from mcp_server.errors import ProfilerError
from mcp_server.schema.io import load_profile
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord
from mcp_server.schema.proof import (
    Comparison,
    KernelDelta,
    ModuleDelta,
    OperatorDelta,
    OperatorMetrics,
    ProfileSummary,
    TotalDelta,
)

COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
NO_MODULE = "<no module>"
ROOT_MODULE = "<root>"
UNATTRIBUTED = "<unattributed>"
MISMATCH_REMEDY = "pass --allow-mismatch to compare anyway"
CAST_OPS = frozenset(
    {"aten::to", "aten::_to_copy", "aten::copy_", "aten::type_as", "aten::_autocast_to_reduced_precision",
     "aten::_autocast_to_full_precision", "aten::contiguous", "aten::clone"}
)
COUNTERS = (
    "achieved_occupancy_pct",
    "tensor_core_active_pct",
    "sm_throughput_pct",
    "dram_throughput_pct",
    "l1_hit_rate_pct",
    "l2_hit_rate_pct",
    "arithmetic_intensity_flop_per_byte",
)
MAX_MISMATCH_EXAMPLES = 3
SHAPE_UNSAFE_FAMILIES = frozenset({"aten::linear"})
# Decomposed or compiled spellings of an eager operator (after overload and in-place suffixes are dropped).
OP_ALIASES = {
    **dict.fromkeys(
        ("aten::_native_batch_norm_legit_no_training", "aten::_native_batch_norm_legit", "aten::native_batch_norm",
         "aten::_batch_norm_impl_index", "aten::cudnn_batch_norm", "aten::_batch_norm_with_update",
         "aten::_batch_norm_no_update"),
        "aten::batch_norm",
    ),
    **dict.fromkeys(
        ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv1d", "aten::conv3d",
         "aten::mkldnn_convolution", "aten::convolution_overrideable"),
        "aten::conv2d",
    ),
    **dict.fromkeys(("aten::addmm", "aten::mm", "aten::matmul", "aten::bmm", "aten::baddbmm"), "aten::linear"),
    "aten::max_pool2d_with_indices": "aten::max_pool2d",
    "aten::_adaptive_avg_pool2d": "aten::adaptive_avg_pool2d",
    "aten::native_layer_norm": "aten::layer_norm",
    "aten::native_group_norm": "aten::group_norm",
    "aten::native_dropout": "aten::dropout",
    "aten::_softmax": "aten::softmax",
    "aten::_log_softmax": "aten::log_softmax",
    **dict.fromkeys(
        ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
         "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math",
         "aten::_flash_attention_forward", "aten::_efficient_attention_forward"),
        "aten::scaled_dot_product_attention",
    ),
    **dict.fromkeys(("aten::_lstm", "aten::_cudnn_rnn", "aten::_thnn_fused_lstm_cell"), "aten::lstm"),
    "aten::embedding_dense": "aten::embedding",
}


class ProfileMismatch(ProfilerError):
    """The two profiles are not like for like (device, input shapes, run mode or iteration count)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("refusing to compare: " + "; ".join(reasons), MISMATCH_REMEDY)
        self.reasons = reasons


# --------------------------------------------------------------------------- helpers


def normalize_op_name(name: str) -> str:
    """`aten.add.Tensor`, `aten::add.Tensor` and `aten::add` all become `aten::add`."""
    name = name.strip()
    if "::" in name:
        namespace, rest = name.split("::", 1)
    elif "." in name:
        namespace, rest = name.split(".", 1)
    else:
        return name
    return f"{namespace}::{rest.split('.', 1)[0]}"


def op_family(name: str) -> str:
    """The operator a name stands for across eager, Dynamo and Inductor spellings: overloads and the in-place
    suffix dropped, known decompositions mapped to the eager op (`aten::_native_batch_norm_legit_no_training`
    and `aten::batch_norm` are both `aten::batch_norm`)."""
    name = normalize_op_name(name)
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    return OP_ALIASES.get(name, name)


def _paths(module_path: str | None) -> list[str | None]:
    """A fused kernel spanning modules without a common parent carries them comma-joined."""
    if module_path is None:
        return [None]
    return [p.strip() for p in module_path.split(",")] if "," in module_path else [module_path]


def _under(path: str | None, root: str | None, root_covers_all: bool) -> bool:
    if root is None or path is None:
        return root == path
    if root == "":
        return root_covers_all or path == ""
    return path == root or path.startswith(root + ".")


def _within(module_path: str | None, root: str | None) -> bool:
    """Absorption by name: `module_path` is `root` or below it (the root module "" holds everything)."""
    return any(_under(module_path, r, True) for r in _paths(root))


def _covers(root: str | None, module_path: str | None) -> bool:
    """Absorption by module path alone: as `_within`, but the root module covers only itself."""
    return any(_under(module_path, r, False) for r in _paths(root))


def _ancestor(module_path: str | None, level: int) -> str | None:
    """The module path cut to `level` components ('features.0.bn' at level 1 is 'features'; level 0 is the root)."""
    if module_path is None:
        return None
    return ".".join(module_path.split(".")[:level]) if module_path else module_path


def _depth(module_path: str | None) -> int:
    return max(len(p.split(".")) if p else 0 for p in _paths(module_path))


def module_label(module_path: str | None) -> str:
    """A module path for display and grouping: '<no module>' for None, '<root>' for the top-level module."""
    if module_path is None:
        return NO_MODULE
    return module_path or ROOT_MODULE


def _speedup(baseline: float | None, optimized: float | None) -> float | None:
    """baseline / optimized where both are positive."""
    if not baseline or not optimized or baseline <= 0 or optimized <= 0:
        return None
    return baseline / optimized


def _ratio(optimized: float | None, baseline: float | None) -> float | None:
    if optimized is None or baseline is None or baseline == 0:
        return None
    return optimized / baseline


def _gpu_basis(baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile) -> bool:
    return baseline.capture_metadata.gpu_used and optimized.capture_metadata.gpu_used


def _op_time(op: OperatorRecord, gpu: bool) -> int:
    agg = op.aggregated
    if gpu:
        return agg.total_duration_ns
    if agg.cpu_total_time_ns is not None:
        return agg.cpu_total_time_ns
    return agg.cpu_self_time_ns or 0


def _op_module_time(op: OperatorRecord, gpu: bool) -> int:
    """Time an operator adds to its module: kernel time, or CPU self time (inclusive times would double count)."""
    agg = op.aggregated
    if gpu:
        return agg.total_duration_ns
    if agg.cpu_self_time_ns is not None:
        return agg.cpu_self_time_ns
    return agg.cpu_total_time_ns or 0


def _op_dram(op: OperatorRecord) -> float | None:
    agg = op.aggregated
    if agg.dram_bytes_read is None and agg.dram_bytes_written is None:
        return None
    return (agg.dram_bytes_read or 0.0) + (agg.dram_bytes_written or 0.0)


def _op_kernel_count(op: OperatorRecord) -> int:
    return op.aggregated.kernel_count or len(op.kernels)


def _sum_optional(values: Iterable[float | int | None]) -> float | int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _metrics(ops: list[OperatorRecord], gpu: bool) -> OperatorMetrics:
    """One side of a delta, summed over `ops` (counters time-weighted)."""
    times = [_op_time(op, gpu) for op in ops]
    counters: dict[str, float] = {}
    for name in COUNTERS:
        pairs = [
            (getattr(op.aggregated, name), t)
            for op, t in zip(ops, times, strict=True)
            if getattr(op.aggregated, name) is not None
        ]
        if not pairs:
            continue
        weight = sum(t for _, t in pairs)
        if weight > 0:
            counters[name] = sum(v * t for v, t in pairs) / weight
        else:
            counters[name] = sum(v for v, _ in pairs) / len(pairs)
    total = _sum_optional(op.aggregated.cpu_total_time_ns for op in ops)
    self_time = _sum_optional(op.aggregated.cpu_self_time_ns for op in ops)
    return OperatorMetrics(
        time_ns=sum(times),
        kernel_count=sum(_op_kernel_count(op) for op in ops),
        dram_bytes=_sum_optional(_op_dram(op) for op in ops),
        cpu_total_time_ns=int(total) if total is not None else None,
        cpu_self_time_ns=int(self_time) if self_time is not None else None,
        counters=counters,
    )


def _summary(profile: OperatorAttributedProfile) -> ProfileSummary:
    meta = profile.capture_metadata
    return ProfileSummary(
        workload=meta.workload, device_type=meta.device_type, device_name=meta.device_name, gpu_used=meta.gpu_used,
        compile_mode=meta.compile_mode, run_mode=meta.run_mode, iters=meta.iters, torch_version=meta.torch_version,
        tool=meta.tool,
    )


def _ordered_keys(ops: list[OperatorRecord]) -> list[tuple[str, str | None, int]]:
    """(operator_name, module_path, nth call of that pair) for each operator, in window order."""
    seen: dict[tuple[str, str | None], int] = defaultdict(int)
    keys = []
    for op in ops:
        pair = (op.operator_name, op.module_path)
        keys.append((op.operator_name, op.module_path, seen[pair]))
        seen[pair] += 1
    return keys


# --------------------------------------------------------------------------- matching


class _Matching:
    """The result of tying operators: optimized index -> baseline indices, and the rule used."""

    def __init__(self, baseline: list[OperatorRecord], optimized: list[OperatorRecord]) -> None:
        self.baseline = baseline
        self.optimized = optimized
        self.base_keys = _ordered_keys(baseline)
        self.opt_keys = _ordered_keys(optimized)
        self.pairs: dict[int, list[int]] = {}
        self.rules: dict[int, str] = {}
        self.taken: set[int] = set()
        self._exact()
        self._renamed()
        self._fused_by_names()
        self._fused_by_module()

    def _assign(self, opt_index: int, base_index: int, rule: str) -> None:
        self.pairs.setdefault(opt_index, []).append(base_index)
        self.rules.setdefault(opt_index, rule)
        self.taken.add(base_index)

    def _exact(self) -> None:
        by_key = {key: i for i, key in enumerate(self.base_keys)}
        for j, key in enumerate(self.opt_keys):
            i = by_key.get(key)
            if i is not None:
                self._assign(j, i, "name_module_order")

    def _renamed(self) -> None:
        """Unfused operators left on both sides, same module and op family, paired in call order."""
        free: dict[tuple[str, str | None], list[int]] = defaultdict(list)
        for i in self._free_baseline():
            base = self.baseline[i]
            if not base.is_fused:
                free[(op_family(base.operator_name), base.module_path)].append(i)
        for j, opt in enumerate(self.optimized):
            if j in self.pairs or opt.is_fused:
                continue
            queue = free.get((op_family(opt.operator_name), opt.module_path))
            if queue:
                self._assign(j, queue.pop(0), "renamed")

    def _free_baseline(self) -> list[int]:
        return [i for i in range(len(self.baseline)) if i not in self.taken]

    def _fused(self) -> list[int]:
        return [j for j, op in enumerate(self.optimized) if op.is_fused and j not in self.pairs]

    def _deepest(self, candidates: list[int]) -> int:
        depth = max(_depth(self.optimized[j].module_path) for j in candidates)
        return next(j for j in candidates if _depth(self.optimized[j].module_path) == depth)

    def _claim(self, j: int, families: list[str], region: list[str | None], nearest: bool = False) -> bool:
        """Give fused operator j a free baseline call of each listed op family inside `region`: the earliest, or
        with `nearest` the one whose place in the baseline window is closest to j's place in its own window."""
        claimed = False
        here = j / max(len(self.optimized) - 1, 1)
        for family in dict.fromkeys(families):
            found = [
                i for i in self._free_baseline()
                if op_family(self.baseline[i].operator_name) == family
                and any(_within(self.baseline[i].module_path, r) for r in region)
            ]
            if found:
                scale = max(len(self.baseline) - 1, 1)
                pick = min(found, key=lambda i: (abs(i / scale - here), i)) if nearest else found[0]
                self._assign(j, pick, "fused_names")
                claimed = True
        return claimed

    def _fused_by_names(self) -> None:
        fused = [j for j in self._fused() if self.optimized[j].fused_operators]
        families = {j: [op_family(n) for n in self.optimized[j].fused_operators] for j in fused}
        depth = {j: _depth(self.optimized[j].module_path) for j in fused}
        # Level by level from the deepest module path up. At level L, the fused operators deeper than L that have
        # claimed nothing yet first widen to the subtree of their ancestor at depth L (never to the root), in
        # window order, each taking the calls nearest its own place in the window: a kernel Inductor reuses for a
        # sibling block (attributed to the first block's module) so finds the sibling's calls before a fused
        # operator of the parent module takes them. Then the operators at depth L claim the earliest free calls
        # in their own subtree.
        for level in range(max(depth.values(), default=0), -1, -1):
            if level > 0:
                for j in (j for j in fused if depth[j] > level and j not in self.pairs):
                    region = [_ancestor(p, level) for p in _paths(self.optimized[j].module_path)]
                    self._claim(j, families[j], region, nearest=True)
            for j in (j for j in fused if depth[j] == level):
                self._claim(j, families[j], _paths(self.optimized[j].module_path))
        # Then a fused kernel covering several calls of one op lists its name once: give each remaining baseline
        # call to the deepest fused operator that lists it and holds its module (first on ties).
        for i in self._free_baseline():
            base = self.baseline[i]
            candidates = [
                j for j in fused
                if op_family(base.operator_name) in families[j]
                and _within(base.module_path, self.optimized[j].module_path)
            ]
            if candidates:
                self._assign(self._deepest(candidates), i, "fused_names")

    def _fused_by_module(self) -> None:
        # Every fused operator (not exactly matched) covers its module subtree: a baseline call still free there
        # goes to the deepest fused operator covering it.
        fused = [j for j, op in enumerate(self.optimized) if op.is_fused and self.rules.get(j) != "name_module_order"]
        for i in self._free_baseline():
            path = self.baseline[i].module_path
            candidates = [j for j in fused if _covers(self.optimized[j].module_path, path)]
            if candidates:
                self._assign(self._deepest(candidates), i, "fused_module")


# --------------------------------------------------------------------------- mismatch checks


def _first_input_shape(op: OperatorRecord) -> list[int] | None:
    if not op.input_shapes:
        return None
    return op.input_shapes[0]


def _shape_mismatches(matching: _Matching) -> list[str]:
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


def find_mismatches(
    baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile, matching: _Matching | None = None
) -> list[str]:
    """Why two profiles are not like for like: device, run mode, iteration count, input shapes. Empty if they are."""
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
    matching = matching or _Matching(baseline.operators, optimized.operators)
    shapes = _shape_mismatches(matching)
    if shapes:
        more = f" and {len(shapes) - MAX_MISMATCH_EXAMPLES} more" if len(shapes) > MAX_MISMATCH_EXAMPLES else ""
        reasons.append(
            "different input shapes at " + "; ".join(shapes[:MAX_MISMATCH_EXAMPLES]) + more
            + " (baseline vs optimized)"
        )
    return reasons


# --------------------------------------------------------------------------- deltas


def _operator_deltas(matching: _Matching, gpu: bool) -> list[OperatorDelta]:
    deltas = []
    for j, opt in enumerate(matching.optimized):
        name, module, order = matching.opt_keys[j]
        opt_metrics = _metrics([opt], gpu)
        base_indices = matching.pairs.get(j, [])
        if not base_indices:
            deltas.append(OperatorDelta(
                status="appeared", match_rule="none", operator_name=name, module_path=module, call_order=order,
                optimized_operator_ids=[opt.operator_id], optimized=opt_metrics, time_delta_ns=opt_metrics.time_ns,
            ))
            continue
        base_ops = [matching.baseline[i] for i in base_indices]
        base_metrics = _metrics(base_ops, gpu)
        rule = matching.rules[j]
        deltas.append(OperatorDelta(
            status="matched" if rule in ("name_module_order", "renamed") else "fused",
            match_rule=rule,  # type: ignore[arg-type]
            operator_name=name, module_path=module, call_order=order,
            baseline_operator_ids=[op.operator_id for op in base_ops],
            optimized_operator_ids=[opt.operator_id],
            absorbed_operators=[op.operator_name for op in base_ops] if rule.startswith("fused") else [],
            baseline=base_metrics, optimized=opt_metrics,
            time_delta_ns=opt_metrics.time_ns - base_metrics.time_ns,
            time_ratio=_ratio(opt_metrics.time_ns, base_metrics.time_ns),
        ))
    for i, base in enumerate(matching.baseline):
        if i in matching.taken:
            continue
        name, module, order = matching.base_keys[i]
        base_metrics = _metrics([base], gpu)
        deltas.append(OperatorDelta(
            status="disappeared", match_rule="none", operator_name=name, module_path=module, call_order=order,
            baseline_operator_ids=[base.operator_id], baseline=base_metrics, time_delta_ns=-base_metrics.time_ns,
        ))
    return deltas


def _module_rows(profile: OperatorAttributedProfile, gpu: bool) -> dict[str, dict[str, float | int | None]]:
    rows: dict[str, dict[str, float | int | None]] = {}
    for op in profile.operators:
        row = rows.setdefault(module_label(op.module_path), {"time": 0, "kernels": 0, "ops": 0, "dram": None})
        row["time"] = int(row["time"] or 0) + _op_module_time(op, gpu)
        row["kernels"] = int(row["kernels"] or 0) + _op_kernel_count(op)
        row["ops"] = int(row["ops"] or 0) + 1
        dram = _op_dram(op)
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
            time_ratio=_ratio(o_time, b_time),
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
        name=name, baseline=baseline, optimized=optimized, delta=delta, ratio=_ratio(optimized, baseline),
        speedup=_speedup(baseline, optimized) if is_time else None,
    )


def _cpu_time(profile: OperatorAttributedProfile) -> int | None:
    if profile.window.cpu_operator_time_ns is not None:
        return profile.window.cpu_operator_time_ns
    total = _sum_optional(_op_module_time(op, False) for op in profile.operators)
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
                sum(k.duration_ns for k in baseline.unattributed_kernels),
                sum(k.duration_ns for k in optimized.unattributed_kernels),
                True,
            ),
        ]
        dram_b = _sum_optional(_op_dram(op) for op in baseline.operators)
        dram_o = _sum_optional(_op_dram(op) for op in optimized.operators)
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
    matching = _Matching(baseline.operators, optimized.operators)
    reasons = find_mismatches(baseline, optimized, matching)
    if reasons and not allow_mismatch:
        raise ProfileMismatch(reasons)
    gpu = _gpu_basis(baseline, optimized)
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
        baseline=_summary(baseline), optimized=_summary(optimized),
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
