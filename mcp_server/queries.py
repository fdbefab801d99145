"""Read-only questions about a profile.json, answered without handing an agent the whole file."""

from __future__ import annotations

import difflib
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from mcp_server.errors import UsageError
from mcp_server.schema.io import load_profile
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord
from mcp_server.schema.results import (
    KernelBrief,
    KernelDetail,
    KernelNameTotal,
    ModulePhaseTime,
    OperatorDetail,
    OperatorSummary,
    ProfileHeader,
    TopOperator,
    TopOperatorsResult,
)

MAX_IDS_PER_NAME = 10
CACHED_PROFILES = 4


@lru_cache(maxsize=CACHED_PROFILES)
def _load(path: str, mtime_ns: int, size: int) -> OperatorAttributedProfile:
    return load_profile(Path(path))


def cached_profile(path: Path) -> OperatorAttributedProfile:
    """load_profile, cached by path, modification time and size (callers must not mutate the result)."""
    stat = Path(path).stat()
    return _load(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size)


def header(profile: OperatorAttributedProfile, path: Path) -> ProfileHeader:
    """Where and how the profile was captured."""
    meta = profile.capture_metadata
    return ProfileHeader(
        profile_path=str(path), workload=meta.workload, tool=meta.tool, device_type=meta.device_type,
        device_name=meta.device_name, gpu_used=meta.gpu_used, compile_mode=meta.compile_mode, run_mode=meta.run_mode,
        iters=meta.iters, torch_version=meta.torch_version, python_executable=meta.python_executable,
    )


def _op_time(op: OperatorRecord, gpu: bool) -> int:
    return op.aggregated.total_duration_ns if gpu else (op.aggregated.cpu_total_time_ns or 0)


def top_operators(profile: OperatorAttributedProfile, limit: int = 10) -> list[OperatorSummary]:
    """Operators grouped by name, ranked by GPU kernel time (CPU inclusive time in CPU-only profiles); each share is
    of all the window's kernel time, unattributed kernels included."""
    gpu = profile.capture_metadata.gpu_used
    groups: dict[str, list] = {}
    for op in profile.operators:
        groups.setdefault(op.operator_name, []).append(op)
    rows = []
    for name, ops in groups.items():
        cpu_self = sum(o.aggregated.cpu_self_time_ns or 0 for o in ops)
        rows.append(
            OperatorSummary(
                operator_name=name,
                module_paths=sorted({o.module_path for o in ops if o.module_path})[:5],
                calls=len(ops), kernels=sum(o.aggregated.kernel_count for o in ops),
                gpu_time_ns=sum(o.aggregated.total_duration_ns for o in ops),
                cpu_total_time_ns=None if gpu else sum(o.aggregated.cpu_total_time_ns or 0 for o in ops),
                cpu_self_time_ns=None if gpu else cpu_self, share_pct=0.0, is_fused=any(o.is_fused for o in ops),
                phases=sorted({o.phase for o in ops if o.phase}), call_sites=_heaviest_sites(ops, gpu),
            )
        )
    key = (lambda r: r.gpu_time_ns) if gpu else (lambda r: r.cpu_total_time_ns or 0)
    unattributed = profile.unattributed_kernel_time_ns() if gpu else 0
    total = sum(key(r) for r in rows) + unattributed or 1
    for row in rows:
        row.share_pct = 100.0 * key(row) / total
    return sorted(rows, key=key, reverse=True)[:limit]


def _heaviest_sites(ops: list[OperatorRecord], gpu: bool, limit: int = 3) -> list[str]:
    time: dict[str, int] = {}
    for op in ops:
        if op.call_site:
            time[op.call_site] = time.get(op.call_site, 0) + _op_time(op, gpu)
    return [site for site, _ in sorted(time.items(), key=lambda item: -item[1])[:limit]]


def modules_by_phase(profile: OperatorAttributedProfile, limit: int = 10) -> list[ModulePhaseTime]:
    """Kernel time per (module path, phase), heaviest first; empty for a CPU-only profile."""
    if not profile.capture_metadata.gpu_used:
        return []
    time: dict[tuple[str | None, str | None], list[int]] = {}
    for op in profile.operators:
        entry = time.setdefault((op.module_path, op.phase), [0, 0])
        entry[0] += op.aggregated.total_duration_ns
        entry[1] += 1
    total = profile.window.kernel_time_ns or 1
    rows = [ModulePhaseTime(module_path=module, phase=phase, kernel_time_ns=ns, share_pct=100.0 * ns / total,
                            operator_calls=calls) for (module, phase), (ns, calls) in time.items()]
    return sorted(rows, key=lambda r: -r.kernel_time_ns)[:limit]


def top_rows(profile: OperatorAttributedProfile, limit: int) -> list[TopOperator]:
    """top_operators, each row with the ids of its heaviest calls."""
    gpu = profile.capture_metadata.gpu_used
    calls: dict[str, list[OperatorRecord]] = defaultdict(list)
    for op in profile.operators:
        calls[op.operator_name].append(op)
    rows = []
    for row in top_operators(profile, limit):
        heaviest = sorted(calls[row.operator_name], key=lambda o: _op_time(o, gpu), reverse=True)
        rows.append(TopOperator(**row.model_dump(), operator_ids=[o.operator_id for o in heaviest[:MAX_IDS_PER_NAME]]))
    return rows


def top_operators_result(path: Path, limit: int) -> TopOperatorsResult:
    """The heaviest operator names of the profile at `path`."""
    if limit < 1:
        raise UsageError(f"limit must be >= 1, got {limit}", "pass limit=10 or another positive count")
    profile = cached_profile(path)
    return TopOperatorsResult(
        profile=header(profile, path),
        time_basis="gpu_kernel_time" if profile.capture_metadata.gpu_used else "cpu_total_time",
        window=profile.window, operator_names=len({op.operator_name for op in profile.operators}),
        operators=top_rows(profile, limit), modules_by_phase=modules_by_phase(profile, limit),
    )


def _share(part: int, whole: int | None) -> float:
    return round(100.0 * part / whole, 3) if whole else 0.0


def _brief(kernel: KernelRecord) -> KernelBrief:
    return KernelBrief(
        kernel_id=kernel.kernel_id, kernel_name=kernel.kernel_name, start_ns=kernel.start_ns,
        duration_ns=kernel.duration_ns, grid=kernel.grid, block=kernel.block, stream_id=kernel.stream_id,
        module_path=kernel.module_path,
        attribution=f"{kernel.attribution.method.value}/{kernel.attribution.confidence.value}",
        launch_op=kernel.attribution.launch_op, metric_count=len(kernel.metrics),
        propagated_from=kernel.propagated_from,
    )


def operator_detail(path: Path, operator_id: str, max_kernels: int) -> OperatorDetail:
    """One operator call of the profile at `path`: shapes, rolled-up counters, kernels grouped and listed."""
    if max_kernels < 0:
        raise UsageError(f"max_kernels must be >= 0, got {max_kernels}", "pass max_kernels=50 or another count")
    profile = cached_profile(path)
    op = next((o for o in profile.operators if o.operator_id == operator_id), None)
    if op is None:
        ids = [o.operator_id for o in profile.operators]
        close = difflib.get_close_matches(operator_id, ids, n=3, cutoff=0.4) or ids[:3]
        raise UsageError(
            f"no operator {operator_id!r} in {path} ({len(ids)} operator calls)",
            f"pass an operator_id from top_operators (its operator_ids), e.g. {', '.join(close) or 'none exist'}",
        )
    gpu = profile.capture_metadata.gpu_used
    whole = profile.window.kernel_time_ns if gpu else profile.window.cpu_operator_time_ns
    by_name: dict[str, list[int]] = defaultdict(list)
    for kernel in op.kernels:
        by_name[kernel.kernel_name].append(kernel.duration_ns)
    names = sorted(
        (KernelNameTotal(kernel_name=n, launches=len(d), total_duration_ns=sum(d)) for n, d in by_name.items()),
        key=lambda k: k.total_duration_ns, reverse=True,
    )
    return OperatorDetail(
        profile=header(profile, path), operator_id=op.operator_id, operator_name=op.operator_name,
        call_index=op.call_index, module_path=op.module_path, input_shapes=op.input_shapes,
        input_dtypes=op.input_dtypes, is_fused=op.is_fused, fused_operators=op.fused_operators,
        phase=op.phase, call_site=op.call_site, autograd_node=op.autograd_node, forward_op=op.forward_op,
        share_pct=_share(_op_time(op, gpu), whole), aggregated=op.aggregated, kernel_count=len(op.kernels),
        kernel_names=names, kernels=[_brief(k) for k in op.kernels[:max_kernels]],
        kernels_truncated=len(op.kernels) > max_kernels,
        counter_names=sorted({name for k in op.kernels for name in k.metrics}),
    )


def kernel_detail(path: Path, kernel_id: int) -> KernelDetail:
    """One kernel launch of the profile at `path` with all its counters and its operator."""
    profile = cached_profile(path)
    owners: list[tuple[KernelRecord, OperatorRecord | None]] = [
        (k, op) for op in profile.operators for k in op.kernels
    ] + [(k, None) for k in profile.unattributed_kernels]
    if not owners:
        why = "its window launched none" if profile.capture_metadata.gpu_used else "it was captured without a GPU"
        raise UsageError(
            f"{path} holds no kernels: {why}",
            "profile on a machine with an NVIDIA GPU; a CPU profile has operators only (use operator_detail)",
        )
    found = next(((k, op) for k, op in owners if k.kernel_id == kernel_id), None)
    if found is None:
        ids = sorted(k.kernel_id for k, _ in owners)
        raise UsageError(
            f"no kernel {kernel_id} in {path} (kernel ids run {ids[0]}..{ids[-1]})",
            "pass a kernel_id from operator_detail's kernels",
        )
    kernel, op = found
    return KernelDetail(
        profile=header(profile, path), kernel=kernel, operator_id=op.operator_id if op else None,
        operator_name=op.operator_name if op else None,
        share_pct=_share(kernel.duration_ns, profile.window.kernel_time_ns),
        propagated_to=sorted(k.kernel_id for k, _ in owners if k.propagated_from == kernel_id),
    )
