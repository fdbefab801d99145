"""The window measured without the profiler: the timing pass's windows and kernels, joined to the attributed
timeline on launch order (or, where concurrent streams ran the same kernels in another order, on each kernel's n-th
launch).

The timing pass runs the same window `K` times (no NVTX, no hooks, no operator recording, no tracing), each
between CUDA events: the window's length is their median. It then runs the window `T` more times while CUPTI alone
records the kernels: the attributed window's launches, T times over. GPU busy time (the union of a window's
kernels) and the idle time before each launch are the median over the T traced windows; CUPTI's launch callbacks
slow the host, so the gaps are scaled by the untraced window's idle time over the traced one's. (Runs recorded
before the untraced windows existed traced all K windows: the factor is then 1.)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_server.assemble.aggregate import busy_time_ns
from mcp_server.assemble.collectives import kernel_collective
from mcp_server.errors import ProfileFormatError
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult, TimedWindow, load_harness
from mcp_server.schema.profile import Clocks, KernelRecord, OperatorAttributedProfile
from mcp_server.schema.records import TraceKernel
from mcp_server.schema.types import TIMING_PASS
from plugins.torch_profiler.reader import read_kineto_trace

MAX_NAME_MISMATCH = 0.05  # launches whose name differs from the attributed one; above this, no per-kernel gaps


@dataclass
class Unprofiled:
    """The timing pass's window, summarised."""

    windows: int
    clocks: dict[str, Any] | None = None
    wall_ns: int | None = None
    wall_range_ns: list[int] | None = None
    traced_wall_ns: int | None = None
    busy_ns: int | None = None
    gaps: dict[int, int] = field(default_factory=dict)  # kernel_id -> median idle time before it
    warnings: list[str] = field(default_factory=list)


def read_unprofiled(run_dir: RunDir, kernels: Sequence[KernelRecord]) -> Unprofiled | None:
    """The timing pass of `run_dir` against the attributed window's `kernels` (None when it did not run)."""
    result = load_harness(run_dir.harness_result(TIMING_PASS))
    if result is None or not result.ok:
        return None
    windows = _untraced(result)
    traced_windows = result.traced_windows or windows
    summary = Unprofiled(windows=len(windows), wall_ns=_median_elapsed(windows), wall_range_ns=_range(windows),
                         traced_wall_ns=_median_elapsed(traced_windows), clocks=result.clocks,
                         warnings=[f"timing pass: {w}" for w in result.warnings])  # why it measured less
    trace = run_dir.kineto_trace(TIMING_PASS)
    if not trace.is_file():
        summary.warnings.append("the timing pass traced no kernels: no unprofiled GPU busy time")
        return summary
    try:
        traced = read_kineto_trace(trace).kernels
    except (ValueError, KeyError) as exc:
        raise ProfileFormatError(f"{trace} is not a readable Kineto trace: {exc}", "re-run the capture") from exc
    ordered = sorted(kernels, key=lambda k: k.kernel_id)
    count, runs = len(ordered), len(traced_windows)
    if not count or len(traced) != count * runs:
        summary.warnings.append(
            f"the timing pass ran {len(traced)} kernels in {runs} traced windows, not {count} per window as the "
            "profiled window did: its per-kernel gaps are left out"
        )
        busy = [busy_time_ns([(k.start_ns, k.start_ns + k.duration_ns) for k in traced])]
        summary.busy_ns = busy[0] // max(runs, 1)
        return summary
    per_window = [traced[i * count:(i + 1) * count] for i in range(runs)]
    summary.busy_ns = int(statistics.median(busy_time_ns([(k.start_ns, k.start_ns + k.duration_ns) for k in w])
                                            for w in per_window))
    names = [_name(k.kernel_name) for k in ordered]
    mismatched = sum(1 for name, t in zip(names, per_window[0], strict=True) if name != _name(t.name))
    positions = [list(range(count))] * runs  # each attributed launch's place in each traced window
    if mismatched > MAX_NAME_MISMATCH * count:
        positions = [p for w in per_window if (p := _by_occurrence(names, w)) is not None]
        if len(positions) != runs:
            summary.warnings.append(f"{mismatched} of {count} launches of the timing pass are other kernels than the "
                                    "profiled window's, in launch order: its per-kernel gaps are left out")
            return summary
    gaps = [_gaps(w) for w in per_window]
    factor = 1.0
    if summary.wall_ns and summary.traced_wall_ns and summary.traced_wall_ns > summary.busy_ns:
        factor = min(1.0, max(0, summary.wall_ns - summary.busy_ns) / (summary.traced_wall_ns - summary.busy_ns))
    summary.gaps = {k.kernel_id: int(factor * statistics.median(g[at[i]] for g, at in zip(gaps, positions,
                                                                                          strict=True)))
                    for i, k in enumerate(ordered) if all(at[i] for at in positions)}
    return summary


@dataclass(frozen=True)
class RankTiming:
    """One rank's timing pass, as the cross-rank merge reads it."""

    window_ns: int | None
    communication_ns: int | None  # collectives' kernels per traced window (their union, mean over the windows)


def rank_timing(run_dir: RunDir) -> RankTiming | None:
    """The window a rank's timing pass measured, and its time in collectives under the pass's kernel trace (None
    when the rank ran no timing pass)."""
    result = load_harness(run_dir.harness_result(TIMING_PASS))
    if result is None or not result.ok:
        return None
    wall = _median_elapsed(_untraced(result))
    trace = run_dir.kineto_trace(TIMING_PASS)
    if not result.traced_windows or not trace.is_file():
        return RankTiming(window_ns=wall, communication_ns=None)
    try:
        kernels = read_kineto_trace(trace).kernels
    except (ValueError, KeyError) as exc:
        raise ProfileFormatError(f"{trace} is not a readable Kineto trace: {exc}", "re-run the capture") from exc
    spans = [(k.start_ns, k.start_ns + k.duration_ns) for k in kernels if kernel_collective(k.name)]
    return RankTiming(window_ns=wall, communication_ns=busy_time_ns(spans) // len(result.traced_windows))


def _untraced(result: HarnessResult) -> list[TimedWindow]:
    """The timing pass's windows measured without the kernel trace (its one window, in runs recorded before it
    measured several)."""
    window = result.the_window
    return result.windows or [TimedWindow(wall_time_ns=window.wall_time_ns, gpu_elapsed_ns=window.gpu_elapsed_ns)]


def _by_occurrence(names: list[str], window: Sequence[TraceKernel]) -> list[int] | None:
    """Where each attributed launch ran in a traced window whose launches are the same kernels in another order (the
    streams of a CUDA graph or of cuDNN's RNN interleave differently in every run): the n-th launch of a kernel is its
    n-th launch there. None when the window holds other kernels."""
    places: dict[str, list[int]] = {}
    for i, kernel in enumerate(window):
        places.setdefault(_name(kernel.name), []).append(i)
    seen: dict[str, int] = {}
    found = []
    for name in names:
        n = seen[name] = seen.get(name, -1) + 1
        if n >= len(places.get(name, ())):
            return None
        found.append(places[name][n])
    return found


def _median_elapsed(windows: Sequence[TimedWindow]) -> int | None:
    elapsed = [w.gpu_elapsed_ns for w in windows if w.gpu_elapsed_ns]
    return int(statistics.median(elapsed)) if elapsed else None


def _range(windows: Sequence[TimedWindow]) -> list[int] | None:
    """[shortest, longest] of the windows' CUDA-event times (None with fewer than two)."""
    elapsed = [w.gpu_elapsed_ns for w in windows if w.gpu_elapsed_ns]
    return [min(elapsed), max(elapsed)] if len(elapsed) > 1 else None


def _gaps(window: Sequence[TraceKernel]) -> list[int]:
    """The idle time before each launch of one window (0 for its first: the window's start is not on this clock)."""
    gaps, ends = [0], window[0].start_ns + window[0].duration_ns
    for kernel in window[1:]:
        gaps.append(max(0, kernel.start_ns - ends))
        ends = max(ends, kernel.start_ns + kernel.duration_ns)
    return gaps


def _name(name: str) -> str:
    """A kernel's function name without return type, scope, template and parameters: CUPTI's demangled names
    differ between Kineto and Nsight Systems (`true` / `(bool)1`, `(anonymous namespace)` / `<unnamed>`)."""
    text = " ".join(name.split()).replace("(anonymous namespace)", "_").replace("<unnamed>", "_")
    cut = min((i for i in (text.find("<"), text.find("(")) if i > 0), default=len(text))
    return text[:cut].split(" ")[-1].rsplit("::", 1)[-1]


def apply_unprofiled(profile: OperatorAttributedProfile, unprofiled: Unprofiled | None) -> None:
    """Put the unprofiled window's totals and per-kernel gaps into the profile (and its warnings)."""
    if unprofiled is None:
        return
    window = profile.window
    window.unprofiled_wall_time_ns, window.unprofiled_gpu_busy_time_ns = unprofiled.wall_ns, unprofiled.busy_ns
    window.unprofiled_windows = unprofiled.windows
    window.unprofiled_wall_time_range_ns = unprofiled.wall_range_ns
    window.unprofiled_traced_wall_time_ns = unprofiled.traced_wall_ns
    profile.warnings += unprofiled.warnings
    clocks = unprofiled.clocks
    if clocks:
        profile.capture_metadata.clocks = Clocks(
            sm_clock_mhz=clocks["sm_mhz"][1], memory_clock_mhz=clocks["memory_mhz"][1],
            sm_clock_range_mhz=clocks["sm_mhz"], memory_clock_range_mhz=clocks["memory_mhz"], samples=clocks["samples"],
            source=f"nvidia-smi every {clocks.get('every_ms', '?')} ms through the timing pass's warm-up and windows",
        )
    if unprofiled.gaps:
        for kernel in [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels:
            object.__setattr__(kernel, "unprofiled_gap_ns", unprofiled.gaps.get(kernel.kernel_id))
