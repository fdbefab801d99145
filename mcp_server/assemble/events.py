"""The window's host synchronisations and memory copies and sets, attributed like kernels.

Each call's operator is the outermost operator range around it on its thread (the operator call whose kernels
share that range has the `operator_id`), its module, phase and call site what its stack says (`phases.work_of`).
A synchronising call makes the GPU wait for the host afterwards: the first kernel to start after it returned, and
the idle time before that kernel, are its cost; in the window measured without the profiler, that kernel's own
`unprofiled_gap_ns`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from mcp_server.assemble.phases import Context, work_of
from mcp_server.schema.harness import HarnessResult
from mcp_server.schema.profile import GraphBreak, KernelRecord, OperatorAttributedProfile, RuntimeEvent
from mcp_server.schema.records import RuntimeCall
from plugins.nvtx_names import operator_frames

OperatorKeys = dict[tuple[object, ...], str]  # ("op", thread, outer range's start, its name) -> operator_id
DDP_TIMING_SYNC = "cudaEventSynchronize"
DDP_TIMING_WARNING = (
    "{count} cudaEventSynchronize call(s) in DistributedDataParallel's forward are DDP's own timing of its first 10 "
    "iterations (and every 100th), which waits for the CUDA events of the iteration before; later iterations do not "
    "wait (origin `ddp_timing`, left out of the workload's synchronisations): a window after DDP's 10th iteration "
    "(--warmup-iters 11, or --steps 11:A for a script) measures without them")


def attribute_events(
    calls: Sequence[RuntimeCall], window_start_ns: int, context: Context, operator_ids: OperatorKeys,
    kernels: Sequence[KernelRecord], ddp_timed: bool = False,
) -> list[RuntimeEvent]:
    """The window's runtime calls as profile events (times relative to `window_start_ns`, as the kernels').
    `ddp_timed`: the window holds an iteration DistributedDataParallel timed (`DDP_TIMING_SYNC`)."""
    ordered = sorted(kernels, key=lambda k: (k.start_ns, k.kernel_id))
    starts = [k.start_ns for k in ordered]
    gaps, reach = [], None
    for kernel in ordered:  # the idle time before each kernel: after every kernel that started before it ended
        gaps.append(0 if reach is None else max(0, kernel.start_ns - reach))
        end = kernel.start_ns + kernel.duration_ns
        reach = end if reach is None else max(reach, end)
    first_start = starts[0] if starts else None
    last_end = reach
    events = []
    for call in calls:
        ops = operator_frames(call.stack)
        outer = ops[0] if ops else None
        work = work_of(call.stack, context, call.thread)
        start, end = call.api_start_ns - window_start_ns, call.api_end_ns - window_start_ns
        inside = any(f.kind in ("op", "module", "site") for f in call.stack)
        edge = first_start is None or start < first_start or (last_end is not None and end >= last_end)
        event = RuntimeEvent(
            event_id=call.ordinal, kind=call.kind, api=call.api, start_ns=start, duration_ns=end - start,
            synchronizing=call.synchronizing, origin="workload" if inside or not edge else "harness",
            gpu_start_ns=None if call.gpu_start_ns is None else call.gpu_start_ns - window_start_ns,
            gpu_duration_ns=None if call.gpu_start_ns is None or call.gpu_end_ns is None
            else call.gpu_end_ns - call.gpu_start_ns,
            bytes=call.bytes, copy_kind=call.copy_kind, src_memory=call.src_memory, dst_memory=call.dst_memory,
            sync_type=call.sync_type,
            operator_id=operator_ids.get(("op", call.thread, outer.start_ns, outer.name)) if outer else None,
            operator_name=outer.name if outer else None, launch_op=ops[-1].name if ops else None,
            module_path=work.module_path, call_site=work.call_site, phase=work.phase if inside else None,
        )
        if call.synchronizing:
            after = bisect_left(starts, end)
            if after < len(ordered):
                event.next_kernel_id, event.idle_after_ns = ordered[after].kernel_id, gaps[after]
        if ddp_timed and inside and _ddp_timing(event):
            event.origin = "ddp_timing"
        events.append(event)
    return events


def ddp_timed(harness: HarnessResult) -> bool:
    """Whether the pass's window holds an iteration DistributedDataParallel timed (the harness counted them)."""
    return bool((harness.distributed or {}).get("ddp_timed_iterations"))


def _ddp_timing(event: RuntimeEvent) -> bool:
    """A wait DDP makes as a timed iteration's forward starts (its logger reading the CUDA events of the iteration
    before): a cudaEventSynchronize outside every operator and every line of the workload's."""
    return event.api == DDP_TIMING_SYNC and event.operator_name is None and event.call_site is None


def sites_from_graph_breaks(events: Sequence[RuntimeEvent], breaks: Sequence[GraphBreak] | None) -> None:
    """Under torch.compile no call-site range runs: an operator that ended a graph (Dynamo's break reason names it,
    e.g. `Tensor.item()`, `aten.nonzero`) runs eagerly between graphs, at the break's location. Each such event
    without a call site takes the location of the break naming its operator (the n-th event of an operator the
    n-th break naming it, in order, repeating per window iteration)."""
    if not breaks:
        return
    for operator, words in _BREAK_WORDS.items():
        named = [b for b in breaks if any(w in b.reason for w in words)]
        found = [e for e in events if e.origin == "workload" and e.call_site is None
                 and operator in (e.operator_name, e.launch_op)]
        for number, event in enumerate(found):
            if named:
                event.call_site = named[number % len(named)].location


# What Dynamo's break reason says of an operator that reads data back or has data-dependent shapes.
_BREAK_WORDS = {"aten::_local_scalar_dense": ("item()",), "aten::nonzero": ("nonzero",),
                "aten::unique": ("unique",), "aten::masked_select": ("masked_select",),
                "aten::repeat_interleave": ("repeat_interleave",)}


def apply_unprofiled_idle(profile: OperatorAttributedProfile) -> None:
    """Each synchronising event's cost in the window measured without the profiler: its next kernel's idle gap."""
    if not profile.runtime_events:
        return
    gaps = {k.kernel_id: k.unprofiled_gap_ns for op in profile.operators for k in op.kernels}
    gaps.update({k.kernel_id: k.unprofiled_gap_ns for k in profile.unattributed_kernels})
    for event in profile.runtime_events:
        if event.next_kernel_id is not None:
            event.unprofiled_idle_after_ns = gaps.get(event.next_kernel_id)


def event_warnings(events: Sequence[RuntimeEvent]) -> list[str]:
    """What the profile says of the window's synchronisations, when the workload made any."""
    blocking = [e for e in events if e.synchronizing and e.origin == "workload"]
    timing = sum(1 for e in events if e.origin == "ddp_timing")
    warnings = [DDP_TIMING_WARNING.format(count=timing)] if timing else []
    if not blocking:
        return warnings
    sites = sorted({e.call_site for e in blocking if e.call_site})
    return [f"{len(blocking)} synchronising call(s) inside the window make the host wait for the GPU"
            + (f" (at {', '.join(sites[:3])}{' ...' if len(sites) > 3 else ''})" if sites else "")
            + ": see runtime_events", *warnings]
