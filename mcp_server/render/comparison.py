"""The comparison as markdown (comparison.md), its one-line summary, and the writer of both files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mcp_server.compare import COMPARISON_JSON, COMPARISON_MD, module_label, speedup, total
from mcp_server.compare.matching import absorbed_summary
from mcp_server.schema.io import write_model_atomic, write_text_atomic
from mcp_server.schema.proof import Comparison, OperatorMetrics, TotalDelta


def fmt_ns(value: float | None) -> str:
    if value is None:
        return "–"
    magnitude = abs(value)
    if magnitude >= 1e9:
        return f"{value / 1e9:.3f} s"
    if magnitude >= 1e6:
        return f"{value / 1e6:.3f} ms"
    if magnitude >= 1e3:
        return f"{value / 1e3:.1f} µs"
    return f"{value:.0f} ns"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}×"


def _fmt_count(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _fmt_total_row(t: TotalDelta) -> list[str]:
    fmt: Callable[[float | None], str]
    if t.name.endswith("_ns"):
        fmt = fmt_ns
    elif t.name == "dram_bytes":
        fmt = fmt_bytes
    else:
        fmt = _fmt_count
    return [t.name, fmt(t.baseline), fmt(t.optimized), fmt(t.delta), fmt_ratio(t.speedup)]


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return lines


def render_comparison_markdown(c: Comparison, max_rows: int = 30) -> str:
    """comparison.md: the summary table, then operators, fused groups, appeared/disappeared, modules, kernels."""
    basis = "GPU kernel time" if c.time_basis == "gpu_kernel_time" else "CPU operator time (no GPU kernels)"
    lines = [
        "# Profile comparison",
        "",
        f"- baseline: `{c.baseline.path or c.baseline.workload}` ({c.baseline.compile_mode}, "
        f"{c.baseline.device_name or c.baseline.device_type})",
        f"- optimized: `{c.optimized.path or c.optimized.workload}` ({c.optimized.compile_mode}, "
        f"{c.optimized.device_name or c.optimized.device_type})",
        f"- time basis: {basis}; speedup = baseline / optimized. These figures come from profiles; "
        "quote wall-clock speedups from `operator-profiler bench`.",
        "",
    ]
    if c.mismatches:
        lines += ["> **Not like for like** (compared with --allow-mismatch):", ">"]
        lines += [f"> - {reason}" for reason in c.mismatches]
        lines.append("")
    for warning in c.warnings:
        lines.append(f"> warning: {warning}")
    if c.warnings:
        lines.append("")
    lines += ["## Totals", ""]
    lines += _table(["metric", "baseline", "optimized", "delta", "speedup"], [_fmt_total_row(t) for t in c.totals])
    counts = ", ".join(f"{n} {status}" for status, n in c.match_counts.items())
    lines += ["", f"Operators: {counts}.", ""]

    def time_of(m: OperatorMetrics | None) -> int | None:
        return None if m is None else m.time_ns

    def kernels_of(m: OperatorMetrics | None) -> str:
        return "–" if m is None else str(m.kernel_count)

    changed = sorted((d for d in c.operators if d.status in ("matched", "fused")), key=lambda d: -abs(d.time_delta_ns))
    if changed:
        lines += [f"## Operators (largest changes first, top {min(max_rows, len(changed))} of {len(changed)})", ""]
        rows = [
            [d.operator_name, module_label(d.module_path), str(d.call_order), d.status,
             fmt_ns(time_of(d.baseline)), fmt_ns(time_of(d.optimized)), fmt_ns(d.time_delta_ns),
             fmt_ratio(speedup(time_of(d.baseline), time_of(d.optimized))),
             f"{kernels_of(d.baseline)} → {kernels_of(d.optimized)}",
             f"{fmt_bytes(d.baseline.dram_bytes if d.baseline else None)} → "
             f"{fmt_bytes(d.optimized.dram_bytes if d.optimized else None)}"]
            for d in changed[:max_rows]
        ]
        lines += _table(
            ["operator", "module", "call", "match", "baseline", "optimized", "delta", "speedup", "kernels", "DRAM"],
            rows,
        )
        lines.append("")
    fused = [d for d in c.operators if d.status == "fused"]
    if fused:
        lines += ["## Fused groups", ""]
        rows = [
            [d.operator_name, module_label(d.module_path), absorbed_summary(d.absorbed_operators), d.match_rule,
             fmt_ns(time_of(d.baseline)), fmt_ns(time_of(d.optimized))]
            for d in fused[:max_rows]
        ]
        lines += _table(["fused operator", "module", "absorbed", "rule", "baseline", "optimized"], rows)
        lines.append("")
    for status, title in (("appeared", "Appeared (optimized only)"), ("disappeared", "Disappeared (baseline only)")):
        entries = sorted((d for d in c.operators if d.status == status), key=lambda d: -abs(d.time_delta_ns))
        if not entries:
            continue
        lines += [f"## {title}: {len(entries)}", ""]
        rows = [
            [d.operator_name, module_label(d.module_path), str(d.call_order),
             fmt_ns(time_of(d.optimized if status == "appeared" else d.baseline)),
             kernels_of(d.optimized if status == "appeared" else d.baseline)]
            for d in entries[:max_rows]
        ]
        lines += _table(["operator", "module", "call", "time", "kernels"], rows)
        lines.append("")
    if c.new_casts:
        lines += ["New casts/copies: " + "; ".join(c.new_casts[:max_rows]), ""]
    modules = sorted(c.modules, key=lambda m: -abs(m.time_delta_ns))
    if modules:
        lines += [f"## Modules (largest changes first, top {min(max_rows, len(modules))} of {len(modules)})", ""]
        rows = [
            [m.module_path, fmt_ns(m.baseline_time_ns), fmt_ns(m.optimized_time_ns), fmt_ns(m.time_delta_ns),
             fmt_ratio(speedup(m.baseline_time_ns, m.optimized_time_ns)),
             f"{m.baseline_kernel_count} → {m.optimized_kernel_count}",
             f"{fmt_bytes(m.baseline_dram_bytes)} → {fmt_bytes(m.optimized_dram_bytes)}"]
            for m in modules[:max_rows]
        ]
        lines += _table(["module", "baseline", "optimized", "delta", "speedup", "kernels", "DRAM"], rows)
        lines.append("")
    moved = [k for k in c.kernels if k.status != "unchanged"]
    if moved:
        lines += [f"## Kernels that appeared, disappeared or changed launch count ({len(moved)})", ""]
        rows = [
            [k.kernel_name[:80], k.status, f"{k.baseline_count} → {k.optimized_count}",
             fmt_ns(k.baseline_time_ns), fmt_ns(k.optimized_time_ns)]
            for k in moved[:max_rows]
        ]
        lines += _table(["kernel", "status", "launches", "baseline time", "optimized time"], rows)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_comparison(c: Comparison, out_dir: Path) -> list[Path]:
    """Write comparison.json and comparison.md into `out_dir` (atomically); return their paths."""
    out_dir = Path(out_dir)
    json_path, md_path = out_dir / COMPARISON_JSON, out_dir / COMPARISON_MD
    write_model_atomic(json_path, c)
    write_text_atomic(md_path, render_comparison_markdown(c))
    return [json_path, md_path]


def summary_line(c: Comparison) -> str:
    """One line for the CLI: the headline total and the operator match counts."""
    headline = total(c, "gpu_kernel_time_ns" if c.time_basis == "gpu_kernel_time" else "cpu_operator_time_ns")
    wall = total(c, "window_wall_time_per_iter_ns")
    parts = []
    if headline is not None:
        label = "GPU kernel time" if c.time_basis == "gpu_kernel_time" else "CPU operator time"
        parts.append(f"{label} {fmt_ns(headline.baseline)} → {fmt_ns(headline.optimized)} "
                     f"({fmt_ratio(headline.speedup)})")
    if wall is not None:
        parts.append(f"window wall/iter {fmt_ns(wall.baseline)} → {fmt_ns(wall.optimized)} "
                     f"({fmt_ratio(wall.speedup)})")
    parts.append(", ".join(f"{n} {status}" for status, n in c.match_counts.items()))
    if c.mismatches:
        parts.append(f"{len(c.mismatches)} mismatch(es) allowed")
    return "; ".join(parts)
