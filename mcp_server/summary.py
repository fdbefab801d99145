"""Summaries of a profile: the top-operators table the CLI prints and the MCP tools return."""

from __future__ import annotations

from pydantic import BaseModel

from mcp_server.schema.profile import OperatorAttributedProfile


class OperatorSummary(BaseModel):
    """One operator name (all its calls) in the window."""

    operator_name: str
    module_paths: list[str]
    calls: int
    kernels: int
    gpu_time_ns: int
    cpu_total_time_ns: int | None = None
    cpu_self_time_ns: int | None = None
    share_pct: float
    is_fused: bool


def top_operators(profile: OperatorAttributedProfile, limit: int = 10) -> list[OperatorSummary]:
    """Operators grouped by name, ranked by GPU kernel time (CPU inclusive time in CPU-only profiles)."""
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
            )
        )
    key = (lambda r: r.gpu_time_ns) if gpu else (lambda r: r.cpu_total_time_ns or 0)
    total = sum(key(r) for r in rows) or 1
    for row in rows:
        row.share_pct = 100.0 * key(row) / total
    return sorted(rows, key=key, reverse=True)[:limit]


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_top_operators(profile: OperatorAttributedProfile, limit: int = 10) -> str:
    """A fixed-width table of the top operators, with units in the header."""
    rows = top_operators(profile, limit)
    gpu = profile.capture_metadata.gpu_used
    if gpu:
        header = (
            f"{'operator':44s} {'module':28s} {'calls':>5s} {'kernels':>7s} {'GPU time (us)':>13s} {'share':>6s}"
        )
        lines = [header, "-" * len(header)]
        for r in rows:
            module = ", ".join(r.module_paths) or "-"
            lines.append(
                f"{_short(r.operator_name, 44):44s} {_short(module, 28):28s} {r.calls:5d} {r.kernels:7d} "
                f"{r.gpu_time_ns / 1000:13.1f} {r.share_pct:5.1f}%"
            )
    else:
        header = (
            f"{'operator':44s} {'module':28s} {'calls':>5s} {'CPU self (us)':>13s} {'CPU total (us)':>14s} "
            f"{'share':>6s}"
        )
        lines = [header, "-" * len(header)]
        for r in rows:
            module = ", ".join(r.module_paths) or "-"
            lines.append(
                f"{_short(r.operator_name, 44):44s} {_short(module, 28):28s} {r.calls:5d} "
                f"{(r.cpu_self_time_ns or 0) / 1000:13.1f} {(r.cpu_total_time_ns or 0) / 1000:14.1f} "
                f"{r.share_pct:5.1f}%"
            )
    return "\n".join(lines)


def format_window(profile: OperatorAttributedProfile) -> str:
    """One paragraph on the window: device, wall time, kernel time, attribution coverage."""
    meta, win = profile.capture_metadata, profile.window
    lines = [
        f"device: {meta.device_name} ({meta.device_type}); torch {meta.torch_version}; "
        f"compile mode {meta.compile_mode}; {meta.run_mode}; tool {meta.tool}",
        f"window: {win.wall_time_ns / 1e6:.3f} ms wall over {meta.iters} iteration(s)",
    ]
    if meta.gpu_used:
        lines.append(
            f"kernels: {win.kernel_count}, {win.kernel_time_ns / 1e3:.1f} us total, "
            f"GPU busy {(win.gpu_busy_time_ns or 0) / 1e3:.1f} us; "
            f"attributed {win.attributed_kernel_time_pct or 0:.1f}% of kernel time "
            f"({win.high_confidence_kernel_time_pct or 0:.1f}% high confidence)"
        )
    else:
        lines.append("NO GPU USED: CUDA was not available to the workload; times below are CPU operator times.")
    return "\n".join(lines)
