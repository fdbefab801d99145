"""The text the CLI prints of a profile (the window paragraph and the top-operators table, with units) and of the
optimization loop's status."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from mcp_server.schema.profile import WindowTotals
from mcp_server.schema.ranks import RanksSummary
from mcp_server.schema.results import LoopStatusResult, ModulePhaseTime, OperatorSummary, ProfileHeader


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_top_operators(rows: Sequence[OperatorSummary], gpu: bool) -> str:
    """A fixed-width table of the top operators (GPU kernel time, or CPU times), with units in the header."""
    if gpu:
        header = (
            f"{'operator':44s} {'module':28s} {'calls':>5s} {'kernels':>7s} {'GPU time (us)':>13s} {'share':>6s}"
            f"  {'called at':24s}"
        )
        lines = [header, "-" * len(header)]
        for r in rows:
            module = ", ".join(r.module_paths) or "-"
            lines.append(
                f"{_short(r.operator_name, 44):44s} {_short(module, 28):28s} {r.calls:5d} {r.kernels:7d} "
                f"{r.gpu_time_ns / 1000:13.1f} {r.share_pct:5.1f}%  {_site(r.call_sites)}"
            )
    else:
        header = (
            f"{'operator':44s} {'module':28s} {'calls':>5s} {'CPU self (us)':>13s} {'CPU total (us)':>14s} "
            f"{'op share':>8s}"
        )
        lines = ["outermost operator calls, ranked by CPU total time; op share: of the operators' CPU total time, "
                 "not of the window (`analyze` ranks every operator by self time)", header, "-" * len(header)]
        for r in rows:
            module = ", ".join(r.module_paths) or "-"
            lines.append(
                f"{_short(r.operator_name, 44):44s} {_short(module, 28):28s} {r.calls:5d} "
                f"{(r.cpu_self_time_ns or 0) / 1000:13.1f} {(r.cpu_total_time_ns or 0) / 1000:14.1f} "
                f"{r.share_pct:7.1f}%"
            )
    return "\n".join(lines)


def _site(sites: Sequence[str]) -> str:
    """The heaviest call site as `file.py:line` (the full path is in the profile)."""
    return PurePath(sites[0]).name if sites else "-"


def format_modules_by_phase(rows: Sequence[ModulePhaseTime]) -> str:
    """Kernel time per module and phase (forward, backward, optimizer), heaviest first."""
    header = f"{'module':44s} {'phase':9s} {'calls':>5s} {'GPU time (us)':>13s} {'share':>6s}"
    lines = ["kernel time by module and phase", header, "-" * len(header)]
    for r in rows:
        lines.append(f"{_short(r.module_path or '(no module)', 44):44s} {r.phase or '-':9s} {r.operator_calls:5d} "
                     f"{r.kernel_time_ns / 1000:13.1f} {r.share_pct:5.1f}%")
    return "\n".join(lines)


def format_window(meta: ProfileHeader, win: WindowTotals) -> str:
    """One paragraph on the window: device, wall time, kernel time, attribution coverage."""
    lines = [
        f"device: {meta.device_name} ({meta.device_type}); torch {meta.torch_version}; "
        f"compile mode {meta.compile_mode}; {meta.run_mode}; tool {meta.tool}",
        f"window: {win.wall_time_ns / 1e6:.3f} ms wall over {meta.iters} iteration(s)",
    ]
    if meta.gpu_used:
        lines.append(
            f"kernels: {win.kernel_count}, {win.kernel_time_ns / 1e3:.1f} us total, "
            f"GPU busy {(win.gpu_busy_time_ns or 0) / 1e3:.1f} us; "
            f"attributed {win.attributed_kernel_time_pct or 0:.1f}% of kernel time"
        )
        lines.append(_by_confidence(win))
        if win.module_path_kernel_time_pct is not None:
            sites = win.call_site_kernel_time_pct
            lines.append(f"module paths cover {win.module_path_kernel_time_pct:.1f}% of kernel time"
                         + (f", call sites {sites:.1f}%" if sites is not None else ""))
        if win.kernel_time_by_phase_ns and len(win.kernel_time_by_phase_ns) > 1:
            lines.append("kernel time by phase: " + ", ".join(
                f"{phase} {ns / 1e3:.1f} us" for phase, ns in sorted(win.kernel_time_by_phase_ns.items())))
    else:
        lines.append("NO GPU USED: CUDA was not available to the workload; times below are CPU operator times.")
        if win.cpu_operator_time_ns is not None and win.wall_time_ns:
            lines.append(f"torch operators: {win.cpu_operator_time_ns / 1e6:.3f} ms of the profiled window "
                         f"({100.0 * win.cpu_operator_time_ns / win.wall_time_ns:.1f} %)")
        if win.unprofiled_wall_time_ns and win.unprofiled_wall_time_range_ns:
            low, high = win.unprofiled_wall_time_range_ns
            lines.append(f"without the profiler: {win.unprofiled_wall_time_ns / 1e6:.3f} ms median over "
                         f"{win.unprofiled_windows} windows ({low / 1e6:.3f} to {high / 1e6:.3f} ms)")
    return "\n".join(lines)


def format_ranks(summary: RanksSummary) -> str:
    """ranks.json as text: per rank its window, compute, communication, overlap and idle time; the collectives'
    skew; the stragglers."""
    lines = [f"{summary.world_size} ranks (ranks.json; times from each rank's profile, ms)",
             f"{'rank':>4} {'window':>10} {'compute':>10} {'comm':>10} {'overlap':>10} {'idle':>10}  "
             "comm by collective"]
    for r in summary.ranks:
        by = ", ".join(f"{k} {v / 1e6:.3f}" for k, v in sorted(r.communication_by_collective_ns.items()))
        lines.append(f"{r.rank:>4} {r.window_ns / 1e6:>10.3f} {r.compute_ns / 1e6:>10.3f} "
                     f"{r.communication_ns / 1e6:>10.3f} {r.overlap_ns / 1e6:>10.3f} {r.idle_ns / 1e6:>10.3f}  "
                     f"{by or '-'}")
    if summary.collectives:
        lines.append(f"{summary.collectives} collective calls aligned across ranks; arrival skew median "
                     f"{(summary.skew_ns_median or 0) / 1e6:.3f} ms, max {(summary.skew_ns_max or 0) / 1e6:.3f} ms")
    for s in summary.stragglers:
        lines.append(f"straggler: rank {s.rank}: {s.reason}")
    lines += [f"note: {note}" for note in summary.notes]
    return "\n".join(lines)


def format_loop_status(result: LoopStatusResult) -> str:
    """Each stage's status and why, each checkpoint file with where its freshness came from, then the next stage,
    the `--from=` value and the files reused and written again."""
    state = result.loop_state_path or "no loop_state.json yet: every checkpoint judged by modification times"
    lines = [f"loop of {PurePath(result.workload).name} in {result.folder} ({state})", "",
             f"{'stage':10s} {'status':8s} detail"]
    lines += [f"{s.stage:10s} {s.status:8s} {s.detail}" for s in result.stages]
    lines += ["", f"{'checkpoint':26s} {'status':8s} {'judged by':10s} written by"]
    for c in result.checkpoints:
        by = f"{c.tool} at {c.written_at}" if c.tool else "-"
        lines.append(f"{_short(c.file, 26):26s} {c.status:8s} {c.provenance or '-':10s} {by}")
    lines.append("")
    if result.resume_from is None:
        lines.append(result.summary)
    else:
        lines += [f"next: {result.next_stage}: {result.reason}", f"resume with --from={result.resume_from}"]
    lines.append(f"reuse: {', '.join(result.reused) or 'nothing'}")
    lines.append(f"write again: {', '.join(result.recompute) or 'nothing'}")
    return "\n".join(lines)


def _by_confidence(win: WindowTotals) -> str:
    """How the window's attributed kernel time was tied to operators: high confidence (the launch linked to its
    op by correlation id, torch.profiler) and medium (the NVTX range enclosing the launch, or Inductor's
    provenance)."""
    attributed, high = win.attributed_kernel_time_pct or 0.0, win.high_confidence_kernel_time_pct or 0.0
    return (f"attribution: {high:.1f}% of kernel time by correlation id (high confidence), "
            f"{max(attributed - high, 0.0):.1f}% by the NVTX range enclosing the launch or Inductor's provenance "
            "(medium)")
