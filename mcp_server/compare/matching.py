"""Tie operators across two profiles: names and their compiled spellings, module paths, per-side metrics, and
the matching itself (exact, renamed, fused by names, fused by module; see the package's docstring)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from mcp_server.schema.profile import OperatorAttributedProfile, OperatorRecord, split_module_path
from mcp_server.schema.proof import OperatorMetrics, ProfileSummary

NO_MODULE = "<no module>"
ROOT_MODULE = "<root>"
COUNTERS = (
    "achieved_occupancy_pct",
    "tensor_core_active_pct",
    "sm_throughput_pct",
    "dram_throughput_pct",
    "l1_hit_rate_pct",
    "l2_hit_rate_pct",
    "arithmetic_intensity_flop_per_byte",
)
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
    """A fused kernel spanning modules without a common parent carries them comma-joined; [None] when unknown."""
    return [*split_module_path(module_path)] or [None]


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


def absorbed_summary(names: list[str], kinds: int = 6) -> str:
    """The operators a fused one absorbed, for display: each name once with its count, in order of first appearance,
    the first `kinds` of them (a loop unrolled into one kernel absorbs hundreds)."""
    counts = Counter(names)
    shown = [f"{name} ×{n}" if n > 1 else name for name, n in counts.items()][:kinds]
    rest = len(counts) - len(shown)
    return ", ".join(shown) + (f" and {rest} more kind(s)" if rest > 0 else "") + (
        f" ({len(names)} calls)" if len(names) > len(counts) else "")


def speedup(baseline: float | None, optimized: float | None) -> float | None:
    """baseline / optimized where both are positive."""
    if not baseline or not optimized or baseline <= 0 or optimized <= 0:
        return None
    return baseline / optimized


def ratio(optimized: float | None, baseline: float | None) -> float | None:
    if optimized is None or baseline is None or baseline == 0:
        return None
    return optimized / baseline


def gpu_basis(baseline: OperatorAttributedProfile, optimized: OperatorAttributedProfile) -> bool:
    return baseline.capture_metadata.gpu_used and optimized.capture_metadata.gpu_used


def _op_time(op: OperatorRecord, gpu: bool) -> int:
    agg = op.aggregated
    if gpu:
        return agg.total_duration_ns
    if agg.cpu_total_time_ns is not None:
        return agg.cpu_total_time_ns
    return agg.cpu_self_time_ns or 0


def op_module_time(op: OperatorRecord, gpu: bool) -> int:
    """Time an operator adds to its module: kernel time, or CPU self time (inclusive times would double count)."""
    agg = op.aggregated
    if gpu:
        return agg.total_duration_ns
    if agg.cpu_self_time_ns is not None:
        return agg.cpu_self_time_ns
    return agg.cpu_total_time_ns or 0


def op_dram(op: OperatorRecord) -> float | None:
    agg = op.aggregated
    if agg.dram_bytes_read is None and agg.dram_bytes_written is None:
        return None
    return (agg.dram_bytes_read or 0.0) + (agg.dram_bytes_written or 0.0)


def op_kernel_count(op: OperatorRecord) -> int:
    return op.aggregated.kernel_count or len(op.kernels)


def sum_optional(values: Iterable[float | int | None]) -> float | int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def operator_metrics(ops: list[OperatorRecord], gpu: bool) -> OperatorMetrics:
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
    total = sum_optional(op.aggregated.cpu_total_time_ns for op in ops)
    self_time = sum_optional(op.aggregated.cpu_self_time_ns for op in ops)
    return OperatorMetrics(
        time_ns=sum(times),
        kernel_count=sum(op_kernel_count(op) for op in ops),
        dram_bytes=sum_optional(op_dram(op) for op in ops),
        cpu_total_time_ns=int(total) if total is not None else None,
        cpu_self_time_ns=int(self_time) if self_time is not None else None,
        counters=counters,
    )


def profile_summary(profile: OperatorAttributedProfile) -> ProfileSummary:
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


class Matching:
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
        self._unplaced()
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
        self._pair_in_order(lambda op: (op_family(op.operator_name), op.module_path), "renamed")

    def _unplaced(self) -> None:
        """Unfused operators left on both sides of which one has no module path (an operator a CUDA graph the
        workload captured replays, outside eager mode's module ranges): same op family, paired in call order."""
        self._pair_in_order(lambda op: op_family(op.operator_name), "name_order",
                            lambda base, opt: (base.module_path is None) != (opt.module_path is None))

    def _pair_in_order(self, key: Callable[[OperatorRecord], object], rule: str,
                       fits: Callable[[OperatorRecord, OperatorRecord], bool] = lambda base, opt: True) -> None:
        """Each unpaired unfused optimized operator takes the first free unfused baseline operator of its `key`
        that `fits` it."""
        free: dict[object, list[int]] = defaultdict(list)
        for i in self._free_baseline():
            if not self.baseline[i].is_fused:
                free[key(self.baseline[i])].append(i)
        for j, opt in enumerate(self.optimized):
            if j in self.pairs or opt.is_fused:
                continue
            queue = free.get(key(opt), [])
            pick = next((i for i in queue if fits(self.baseline[i], opt)), None)
            if pick is not None:
                queue.remove(pick)
                self._assign(j, pick, rule)

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
