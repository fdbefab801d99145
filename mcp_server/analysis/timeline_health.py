"""Timeline health of the measured window: utilisation, idle gaps and their likely causes, streams.

Kernels are placed on the window's GPU timeline (start_ns is relative to the window start). A gap is time
when no kernel runs on any stream. Its likely cause: `head` (before the first kernel: host work before the
first launch), `tail` (after the last one), `host_sync` (after a kernel of an op that makes the host wait,
patterns.yaml sync_ops), `launch_bound` (the next kernel runs shorter than the GPU waited for it) or
`host_overhead` (the host was late, the next kernel ran longer than the wait). profile.json carries no
memcpy/sync API records, so memcpy and explicit syncs are seen only through operator names.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from mcp_server.analysis.rules import matches, rule
from mcp_server.assemble.aggregate import busy_time_ns
from mcp_server.schema.analysis import (
    DeviceUsage,
    Finding,
    Gap,
    OperatorKernelCount,
    StreamUsage,
    TimelineHealth,
)
from mcp_server.schema.profile import KernelRecord, OperatorAttributedProfile, OperatorRecord

INSTRUMENTATION_NOTE = (
    "gaps were measured under {tool}, which records a range per operator (and per module in eager mode): that "
    "host time inflates the gaps, so gap-based estimates are upper bounds; confirm with `operator-profiler bench`"
)


UNPROFILED_NOTE = (
    "utilisation, gaps and every window-level estimate come from the window measured without the profiler; "
    "under the profiler the same window took {profiled:.3f} ms with the GPU busy {util:.1f} % of it (its "
    "instrumentation slows the host)"
)


@dataclass
class Placed:
    """A kernel on the window timeline with its neighbourhood."""

    kernel: KernelRecord
    op: OperatorRecord | None
    gap_before_ns: int
    gap_after_ns: int
    pitch_ns: int  # from this kernel's start to the next kernel's start (its own duration for the last one)
    critical: bool  # the next kernel followed within timeline.critical_gap_ns: the GPU was the critical path
    prev_id: int | None = None

    @property
    def end_ns(self) -> int:
        return self.kernel.start_ns + self.kernel.duration_ns


def kernels_finding(kind: str, title: str, members: list[Placed], triggers: list[str], detail: str) -> Finding:
    """A finding about the kernels `members`: their operators, module paths (the kernel's own, else its
    operator's) and ids, each once, in order."""
    return Finding(
        kind=kind, title=title,
        operators=list(dict.fromkeys(p.op.operator_id for p in members if p.op is not None)),
        module_paths=list(dict.fromkeys(m for p in members if (m := p.kernel.module_path or
                                                                  (p.op.module_path if p.op else None)))),
        kernel_ids=[p.kernel.kernel_id for p in members], triggers=triggers, detail=detail,
    )


def window_length(profile: OperatorAttributedProfile) -> tuple[int, str]:
    """Window length on the GPU clock (CUDA events) when recorded, else host wall time; never shorter than
    the kernels it holds."""
    win = profile.window
    kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
    last_end = max((k.start_ns + k.duration_ns for k in kernels), default=0)
    if win.gpu_elapsed_ns:
        length, source = win.gpu_elapsed_ns, "CUDA events around the window"
    else:
        length, source = win.wall_time_ns, "host wall time of the window"
    if last_end > length:
        return last_end, f"{source} ({length / 1e6:.3f} ms) + lead-in to the last kernel's end"
    return length, source


def unprofiled_window(profile: OperatorAttributedProfile) -> tuple[int, str, list[Placed]] | None:
    """The window as measured without the profiler, when the timing pass's totals exist: its length and source,
    and the kernels re-laid in launch order with their profiled durations and their unprofiled gaps (`_lay`; what the
    window holds besides kernels and the gaps between them is put before the first kernel). When the per-kernel
    join failed, or no window was traced (a script that ended before the timing pass's traced windows), each profiled
    gap is scaled so that the window's idle time is the unprofiled one: totals stay measured, the split of idle time
    between gaps is the profiled one; without a traced window the busy time is the profiled kernels' (their durations
    are the GPU's: the profiler slows the host)."""
    win = profile.window
    owners: list[tuple[KernelRecord, OperatorRecord | None]] = [(k, op) for op in profile.operators for k in op.kernels]
    owners += [(k, None) for k in profile.unattributed_kernels]
    owners.sort(key=lambda pair: pair[0].kernel_id)
    if not (win.unprofiled_wall_time_ns and owners):
        return None
    source = (f"no profiler: CUDA events around the window, median of {win.unprofiled_windows} windows "
              "(the timing pass)")
    if any(k.unprofiled_gap_ns is None for k, _ in owners[1:]):
        gaps = _scaled_gaps(owners, win.unprofiled_wall_time_ns, win.unprofiled_gpu_busy_time_ns,
                            window_length(profile)[0])
        source += ("; per-kernel gaps scaled from the profiled ones (their join failed)"
                   if win.unprofiled_gpu_busy_time_ns else
                   "; no window traced: busy time the profiled kernels', gaps scaled from the profiled ones")
    else:
        gaps = [0] + [k.unprofiled_gap_ns or 0 for k, _ in owners[1:]]
    laid, end = _lay(owners, gaps)
    head = max(0, win.unprofiled_wall_time_ns - end)
    relaid = [(k.model_copy(update={"start_ns": k.start_ns + head}), op) for k, op in laid]
    return max(win.unprofiled_wall_time_ns, end + head), source, _place(relaid, win.unprofiled_wall_time_ns)


def _lay(owners: list[tuple[KernelRecord, OperatorRecord | None]],
         gaps: list[int]) -> tuple[list[tuple[KernelRecord, OperatorRecord | None]], int]:
    """The kernels in launch order with their profiled durations, each placed after the idle time the window without
    the profiler had before it. Idle time before a launch means the GPU had finished everything launched earlier; a
    launch with none starts once its own stream is free, and no earlier than the launch before it: kernels of
    concurrent streams (a collective beside the backward that feeds it) overlap as they ran, one stream's stay in
    order. Returns them and the last one's end."""
    laid: list[tuple[KernelRecord, OperatorRecord | None]] = []
    end = previous_start = 0
    stream_end: dict[int | None, int] = {}
    for (kernel, op), gap in zip(owners, gaps, strict=True):
        if not laid:
            start = 0
        elif gap > 0:
            start = end + gap
        else:
            start = max(stream_end.get(kernel.stream_id, 0), previous_start)
        laid.append((kernel.model_copy(update={"start_ns": start}), op))
        stream_end[kernel.stream_id] = start + kernel.duration_ns
        end, previous_start = max(end, start + kernel.duration_ns), start
    return laid, end


def _scaled_gaps(owners: list[tuple[KernelRecord, OperatorRecord | None]], window_ns: int,
                 busy_ns: int | None, profiled_window_ns: int) -> list[int]:
    """The profiled gap before each launch, scaled by the unprofiled window's idle time over the profiled one's
    (`busy_ns` None: the profiled kernels' busy time stands for the unprofiled one)."""
    gaps, end = [0], owners[0][0].start_ns + owners[0][0].duration_ns
    for kernel, _ in owners[1:]:
        gaps.append(max(0, kernel.start_ns - end))
        end = max(end, kernel.start_ns + kernel.duration_ns)
    factor = _idle_factor([k for k, _ in owners], window_ns, busy_ns, profiled_window_ns)
    return [int(g * factor) for g in gaps]


def untraced_idle_factor(profile: OperatorAttributedProfile) -> float | None:
    """What `unprofiled_window` scales the profiled gaps by where no gap was measured without the profiler: the
    unprofiled window's idle time over the profiled one's; None without a window timed without the profiler."""
    win = profile.window
    kernels = [k for op in profile.operators for k in op.kernels] + profile.unattributed_kernels
    if not (win.unprofiled_wall_time_ns and kernels):
        return None
    return _idle_factor(kernels, win.unprofiled_wall_time_ns, win.unprofiled_gpu_busy_time_ns,
                        window_length(profile)[0])


def _idle_factor(kernels: list[KernelRecord], window_ns: int, busy_ns: int | None, profiled_window_ns: int) -> float:
    """The unprofiled window's idle time over the profiled one's, at most 1 (`busy_ns` None: the profiled kernels'
    busy time stands for the unprofiled one)."""
    end = max(k.start_ns + k.duration_ns for k in kernels)
    laid_busy = busy_time_ns([(k.start_ns, k.start_ns + k.duration_ns) for k in kernels])
    profiled_idle = max(profiled_window_ns, end) - laid_busy
    idle = max(0, window_ns - max(busy_ns or 0, laid_busy))
    return min(1.0, idle / profiled_idle) if profiled_idle > 0 else 0.0


def place_kernels(profile: OperatorAttributedProfile, window_ns: int) -> list[Placed]:
    """Every kernel of the window in start order, with the GPU idle time before and after it."""
    owners: list[tuple[KernelRecord, OperatorRecord | None]] = [(k, op) for op in profile.operators for k in op.kernels]
    owners += [(k, None) for k in profile.unattributed_kernels]
    return _place(owners, window_ns)


def _place(owners: list[tuple[KernelRecord, OperatorRecord | None]], window_ns: int) -> list[Placed]:
    owners = sorted(owners, key=lambda pair: (pair[0].start_ns, pair[0].kernel_id))
    critical_gap = rule("timeline", "critical_gap_ns")
    placed: list[Placed] = []
    max_end, holder = 0, None
    for kernel, op in owners:
        gap = max(0, kernel.start_ns - max_end)
        if placed:
            placed[-1].gap_after_ns = gap
            placed[-1].pitch_ns = kernel.start_ns - placed[-1].kernel.start_ns
            placed[-1].critical = gap <= critical_gap
        placed.append(Placed(kernel, op, gap, 0, kernel.duration_ns, False, holder))
        if kernel.start_ns + kernel.duration_ns >= max_end:
            max_end, holder = kernel.start_ns + kernel.duration_ns, kernel.kernel_id
    if placed:
        tail = max(0, window_ns - max_end)
        placed[-1].gap_after_ns = tail
        placed[-1].critical = tail <= critical_gap
    return placed


def _is_sync(op: OperatorRecord | None, kernel: KernelRecord | None) -> bool:
    launch = kernel.attribution.launch_op if kernel is not None else None
    return matches("sync_ops", op.operator_name if op else None) or matches("sync_ops", launch)


def idle_gaps(placed: list[Placed], window_ns: int) -> list[Gap]:
    if not placed:
        return []
    by_id = {p.kernel.kernel_id: p for p in placed}
    ratio = rule("launch", "launch_bound_gap_ratio")
    gaps = []
    first = placed[0]
    if first.gap_before_ns > 0:
        gaps.append(Gap(start_ns=0, duration_ns=first.gap_before_ns, before_kernel_id=first.kernel.kernel_id,
                        cause="head"))
    for p in placed[1:]:
        if p.gap_before_ns <= 0:
            continue
        prev = by_id.get(p.prev_id) if p.prev_id is not None else None
        if prev is not None and _is_sync(prev.op, prev.kernel):
            cause = "host_sync"
        elif p.gap_before_ns >= ratio * max(p.kernel.duration_ns, 1):
            cause = "launch_bound"
        else:
            cause = "host_overhead"
        gaps.append(Gap(start_ns=p.kernel.start_ns - p.gap_before_ns, duration_ns=p.gap_before_ns,
                        after_kernel_id=p.prev_id, before_kernel_id=p.kernel.kernel_id, cause=cause))
    last = placed[-1]
    if last.gap_after_ns > 0:
        end = max(p.end_ns for p in placed)
        gaps.append(Gap(start_ns=end, duration_ns=last.gap_after_ns, after_kernel_id=last.kernel.kernel_id,
                        cause="tail"))
    return gaps


def _head_as_remainder(gaps: list[Gap], idle_ns: int) -> list[Gap]:
    """The gaps with the head gap set to what the measured idle time leaves after the others (the re-laid
    window's kernels keep their profiled durations, which differ slightly from the unprofiled ones)."""
    rest = sum(g.duration_ns for g in gaps if g.cause != "head")
    head = max(0, idle_ns - rest)
    others = [g for g in gaps if g.cause != "head"]
    return ([Gap(start_ns=0, duration_ns=head, before_kernel_id=gaps[0].before_kernel_id, cause="head")]
            if head and gaps[0].cause == "head" else []) + others


def _streams(placed: list[Placed], union: int) -> tuple[list[StreamUsage], int]:
    groups: dict[tuple[int | None, int | None], list[Placed]] = {}
    for p in placed:
        groups.setdefault((p.kernel.device_id, p.kernel.stream_id), []).append(p)
    usage = [
        StreamUsage(stream_id=sid, device_id=device, kernel_count=len(ps),
                    busy_ns=busy_time_ns([(p.kernel.start_ns, p.end_ns) for p in ps]))
        for (device, sid), ps in sorted(groups.items(), key=lambda item: -len(item[1]))
    ]
    overlap = sum(u.busy_ns for u in usage) - union if len(usage) > 1 else 0
    return usage, max(0, overlap)


def _devices(placed: list[Placed], union: int, window_ns: int) -> tuple[list[DeviceUsage], int, str | None]:
    """Each GPU's kernels and busy time when there are several, the time they were busy at once (`union`: all
    kernels' busy time), and a note that says how they shared the window (none for one GPU)."""
    groups: dict[int | None, list[Placed]] = {}
    for p in placed:
        groups.setdefault(p.kernel.device_id, []).append(p)
    if len(groups) < 2:
        return [], 0, None
    devices = [DeviceUsage(device_id=device, kernel_count=len(ps),
                           busy_ns=(busy := busy_time_ns([(p.kernel.start_ns, p.end_ns) for p in ps])),
                           utilization_pct=min(100.0, 100.0 * busy / window_ns) if window_ns else 0.0)
               for device, ps in sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or 0))]
    overlap = max(0, sum(d.busy_ns for d in devices) - union)
    shares = ", ".join(f"GPU {d.device_id} {d.busy_ns / 1e6:.3f} ms ({d.utilization_pct:.0f} %)" for d in devices)
    note = (f"{len(devices)} GPUs ran the window's kernels: busy {shares} of the window (kernel times from the "
            f"profiled timeline over the window), at once for {overlap / 1e6:.3f} ms; utilisation above is of the "
            "union of all of them")
    least = min(d.busy_ns for d in devices)
    if overlap < rule("timeline", "devices_turn_overlap") * least:
        note += (": the GPUs take turns, each idle while another works (a model split across them runs one stage "
                 "at a time); micro-batches through the stages (torch.distributed.pipelining) or data parallelism "
                 "(DDP, FSDP) keep them busy at once")
    return devices, overlap, note


def _per_operator(profile: OperatorAttributedProfile) -> list[OperatorKernelCount]:
    groups: dict[str, list[OperatorRecord]] = {}
    for op in profile.operators:
        groups.setdefault(op.operator_name, []).append(op)
    rows = [
        OperatorKernelCount(operator_name=name, calls=len(ops), kernels=sum(len(o.kernels) for o in ops),
                            kernel_time_ns=sum(k.duration_ns for o in ops for k in o.kernels))
        for name, ops in groups.items()
    ]
    if profile.unattributed_kernels:
        rows.append(OperatorKernelCount(operator_name="(unattributed)", calls=0,
                                        kernels=len(profile.unattributed_kernels),
                                        kernel_time_ns=sum(k.duration_ns for k in profile.unattributed_kernels)))
    return sorted(rows, key=lambda r: -r.kernel_time_ns)


def timeline_health(profile: OperatorAttributedProfile, placed: list[Placed], window_ns: int,
                    window_source: str, profiled: TimelineHealth | None = None) -> TimelineHealth:
    """Utilisation, gaps by cause, kernel statistics and stream usage of the window. With `profiled` (the
    instrumented window's health), `placed` is the window measured without the profiler, whose measured GPU busy
    time stands, and the instrumented numbers are kept beside it."""
    durations = [p.kernel.duration_ns for p in placed]
    union = busy = busy_time_ns([(p.kernel.start_ns, p.end_ns) for p in placed]) if placed else 0
    if profiled is not None and profile.window.unprofiled_gpu_busy_time_ns:
        busy = profile.window.unprofiled_gpu_busy_time_ns
    tiny = sum(1 for d in durations if d < rule("launch", "tiny_kernel_ns"))
    ratio = rule("launch", "launch_bound_gap_ratio")
    waited = sum(1 for p in placed if p.gap_before_ns >= ratio * max(p.kernel.duration_ns, 1))
    gaps = idle_gaps(placed, window_ns)
    if profiled is not None and gaps:  # the head is the remainder: idle time by cause sums to the measured idle
        gaps = _head_as_remainder(gaps, max(0, window_ns - busy))
    by_cause: dict[str, int] = {}
    for gap in gaps:
        by_cause[gap.cause] = by_cause.get(gap.cause, 0) + gap.duration_ns
    inner = [g.duration_ns for g in gaps if g.cause not in ("head", "tail")]
    streams, overlap = _streams(placed, union)
    devices, device_overlap, devices_note = _devices(placed, union, window_ns)
    notes = []
    if placed and profiled is None:
        notes.append(INSTRUMENTATION_NOTE.format(tool=profile.capture_metadata.tool))
    elif placed and profiled is not None:
        notes.append(UNPROFILED_NOTE.format(profiled=profiled.window_ns / 1e6,
                                            util=profiled.gpu_utilization_pct))
    if "lead-in" in window_source:
        notes.append("kernel times count from the window's opening range, which starts before the CUDA events "
                     "are recorded: the window is extended to the last kernel's end, and the head gap includes "
                     "that lead-in")
    if busy > window_ns and profiled is not None:
        notes.append(f"GPU busy time under the timing pass's kernel trace ({busy / 1e6:.3f} ms) exceeds the window "
                     f"timed without it ({window_ns / 1e6:.3f} ms): kernels ran longer under the trace (a collective "
                     "waiting for a peer the trace slowed, for one); utilisation is capped at 100 %")
    elif busy > window_ns:
        notes.append("kernels run beyond the window's length: the window is shorter than their union")
    if devices_note:
        notes.append(devices_note)
    return TimelineHealth(
        window_ns=window_ns, window_source=window_source, wall_time_ns=profile.window.wall_time_ns, gpu_busy_ns=busy,
        gpu_utilization_pct=min(100.0, 100.0 * busy / window_ns) if window_ns else 0.0,
        idle_ns=max(0, window_ns - busy), kernel_count=len(placed), kernel_time_ns=sum(durations),
        mean_kernel_ns=statistics.fmean(durations) if durations else None,
        median_kernel_ns=float(statistics.median(durations)) if durations else None,
        tiny_kernel_count=tiny, tiny_kernel_pct=100.0 * tiny / len(placed) if placed else None,
        launch_bound_kernel_pct=100.0 * waited / len(placed) if placed else None,
        mean_gap_ns=statistics.fmean(inner) if inner else None, idle_by_cause_ns=by_cause,
        host_compute_ns=min(max(0, window_ns - busy), profile.window.host_compute_ns or 0),
        largest_gaps=sorted(gaps, key=lambda g: -g.duration_ns)[: int(rule("timeline", "largest_gaps"))],
        streams=streams, multi_stream_overlap_ns=overlap, devices=devices, device_overlap_ns=device_overlap,
        kernels_per_operator=_per_operator(profile), notes=notes,
        unprofiled=profiled is not None, profiled_window_ns=profiled.window_ns if profiled else None,
        window_range_ns=profile.window.unprofiled_wall_time_range_ns if profiled is not None else None,
        profiled_gpu_utilization_pct=profiled.gpu_utilization_pct if profiled else None,
    )
