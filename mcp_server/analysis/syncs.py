"""Where the window makes the host wait for the GPU, or copies memory, and what that costs; the changes that must
come before a CUDA graph or a whole-graph compile of such a window.

A synchronising call (a stream or device synchronisation, the copy of `.item()`, a `nonzero` reading its count)
stops the host until the GPU has drained; the GPU then idles until the host launches again. Its cost is that idle
time: the gap before the next kernel, from the window measured without the profiler where the timing pass ran.
A CUDA graph cannot capture such a call, and Dynamo breaks its graph at one (or at a data-dependent shape), so any
advice to capture or compile the whole window names the change that must come first.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_server.analysis.rules import matches
from mcp_server.analysis.timeline_health import untraced_idle_factor
from mcp_server.schema.analysis import Finding, SyncPoint
from mcp_server.schema.profile import OperatorAttributedProfile, OperatorRecord, RuntimeEvent

READBACK = "readback_ops"  # patterns.yaml: operators that read a GPU value back into Python (.item())
DATA_DEPENDENT = "data_dependent_ops"  # operators whose output shape depends on the data (nonzero, unique...)
COPIES = "copy_ops"  # operators whose own work is a copy
SHORT_END = " — "  # a prerequisite's short form ends here; how to do it follows


def counted_repeats(op: OperatorRecord) -> bool:
    """A `repeat_interleave` whose repeats are a number (its second input has no shape): its output's shape follows
    from its input's, so nothing waits for the data; one with a tensor of repeats reads their sum back."""
    shapes = op.input_shapes or []
    return op.operator_name == "aten::repeat_interleave" and len(shapes) > 1 and shapes[1] == []


def _offloaded(event: RuntimeEvent) -> bool:
    """A copy to the host (or the wait it makes) inside a forward operator that copies and reads nothing itself: the
    tensor autograd saves, copied out by a saved-tensor hook as the operator saves it (`save_on_cpu`'s pack hook runs
    `copy_` inside the operator that saves)."""
    inner, outer = event.launch_op, event.operator_name
    copying = matches(COPIES, inner) and (event.kind == "sync" or event.copy_kind == "DtoH")
    return (copying and event.phase == "forward" and outer is not None and not matches(COPIES, outer)
            and not matches(READBACK, outer))


def _data_dependent(event: RuntimeEvent) -> bool:
    names = (event.operator_name, event.launch_op)
    return any(matches(READBACK, n) or matches(DATA_DEPENDENT, n) for n in names)


IDLE_SOURCES = {  # SyncPoint.idle_source -> how the idle time after the calls was measured, in words
    "unprofiled": "measured without the profiler",
    "scaled": "under the profiler, scaled to the idle time of the window measured without it (no window traced)",
    "profiled": "inflated by profiler instrumentation: no timing pass ran",
}


def idle_wording(source: str | None) -> str:
    """How the idle time after the calls was measured (`SyncPoint.idle_source`), in words."""
    return IDLE_SOURCES.get(source or "profiled", IDLE_SOURCES["profiled"])


def sync_points(profile: OperatorAttributedProfile) -> list[SyncPoint] | None:
    """The window's synchronisations, copies and sets made by the workload, grouped by place (call site, API,
    operator), the costliest first; None when the profile holds no runtime events."""
    events = profile.runtime_events
    if events is None:
        return None
    unprofiled = profile.window.unprofiled_wall_time_ns is not None
    factor = _idle_factor(profile)
    owners = _gap_owners(events)
    groups: dict[tuple[object, ...], list[RuntimeEvent]] = {}
    for event in events:
        if event.origin == "workload":
            key = (event.call_site, event.api, event.operator_name, event.module_path, event.copy_kind,
                   event.src_memory, event.dst_memory)
            groups.setdefault(key, []).append(event)
    points = []
    for group in groups.values():
        first = group[0]
        # without the profiler where the timing pass traced the window; else as profiled (idle time inflated)
        # each idle gap once: several calls before one kernel share the gap that kernel ends
        waits = [e for e in group if e.synchronizing]
        known = [i if e.event_id in owners else 0 for e in waits if (i := e.unprofiled_idle_after_ns) is not None]
        source = "unprofiled" if unprofiled and known else "profiled" if factor is None else "scaled"
        if source != "unprofiled":
            known = [i if e.event_id in owners else 0 for e in waits if (i := e.idle_after_ns) is not None]
            known = known if factor is None else [int(i * factor) for i in known]
        sizes = [e.bytes for e in group if e.bytes is not None]
        points.append(SyncPoint(
            call_site=first.call_site, api=first.api, kind=first.kind, operator_name=first.operator_name,
            module_path=first.module_path, synchronizing=any(e.synchronizing for e in group),
            data_dependent=any(_data_dependent(e) for e in group), offloaded=all(_offloaded(e) for e in group),
            count=len(group),
            bytes=sum(sizes) if sizes else None, copy_kind=first.copy_kind, src_memory=first.src_memory,
            dst_memory=first.dst_memory, host_wait_ns=sum(e.duration_ns for e in group),
            idle_after_ns=sum(known) if known else None,
            idle_source=source if known else None,
            event_ids=[e.event_id for e in group]))
    points.sort(key=lambda p: (not p.synchronizing, -(p.idle_after_ns or 0), -p.host_wait_ns))
    return points


def _gap_owners(events: Sequence[RuntimeEvent]) -> set[int]:
    """The workload's synchronising calls that own the idle gap after them: of the calls before one kernel (a
    `cudaDeviceSynchronize` followed by more, before the next launch), the first; the others' idle is that same gap."""
    owners: set[int] = set()
    seen: set[int] = set()
    for event in sorted(events, key=lambda e: e.start_ns):
        if event.origin != "workload" or not event.synchronizing:
            continue
        if event.next_kernel_id is None or event.next_kernel_id not in seen:
            owners.add(event.event_id)
        if event.next_kernel_id is not None:
            seen.add(event.next_kernel_id)
    return owners


def _idle_factor(profile: OperatorAttributedProfile) -> float | None:
    """What the profiled idle after each call is scaled by where the timing pass timed the window but traced none of
    it (a script that ended first): the one the window's profiled gaps are scaled by. None where the calls' own
    unprofiled idle is known, or nothing was timed without the profiler."""
    if any(e.unprofiled_idle_after_ns is not None for e in profile.runtime_events or []):
        return None
    return untraced_idle_factor(profile)


def _where(point: SyncPoint) -> str:
    return point.call_site.rsplit("/", 1)[-1] if point.call_site else f"{point.operator_name or point.api}"


def _read_kind(operator: str | None) -> str:
    """How Python read a tensor's value, by the operator that read it: `if t.any():` runs `aten::is_nonzero`."""
    return {"aten::is_nonzero": "bool()", "aten::equal": "torch.equal()", "aten::tolist": ".tolist()"}.get(
        operator or "", ".item()")


def prerequisites(profile: OperatorAttributedProfile, points: Sequence[SyncPoint] | None,
                  in_modules: bool = False) -> list[str]:
    """What must change before the window can be captured in a CUDA graph or compiled whole: its data-dependent
    shapes made static, and a script's batches of several shapes, its value reads moved out of the loop, its other
    synchronisations removed. `in_modules`:
    what must change before the model alone is compiled or one call of it captured, those inside its modules only
    (a script's `loss.item()`, a decode loop's stop check between steps stay where they are)."""
    needs: list[str] = []
    operators = [op for op in profile.operators if op.module_path or not in_modules]
    points = [p for p in points or [] if p.module_path or not in_modules]
    operators = [op for op in operators if not counted_repeats(op)]
    launched = {k.attribution.launch_op for op in operators for k in op.kernels}
    shaped = sorted({name for name in {op.operator_name for op in operators} | launched
                     if name and matches(DATA_DEPENDENT, name)})
    # a synchronisation a data-dependent shape made, inside the operator called (a boolean mask's aten::index)
    shaped_points = [p for p in points if p.data_dependent and not matches(READBACK, p.operator_name)]
    shaped_sites = sorted({_where(p) for p in shaped_points})
    if shaped or shaped_sites:
        what = ", ".join(shaped or sorted({p.operator_name for p in shaped_points if p.operator_name})) or (
            "operators with data-dependent output shapes")
        needs.append(f"make the shapes static ({what}{' at ' + ', '.join(shaped_sites) if shaped_sites else ''})"
                     f"{SHORT_END}pad to a fixed size or route with a fixed capacity and masks, or let Dynamo trace "
                     "them with torch._dynamo.config.capture_dynamic_output_shape_ops = True (a CUDA graph still "
                     "needs static shapes)")
    varying = profile.capture_metadata.varying_inputs or {}
    if varying and not in_modules:  # a script's batches of several shapes: the model alone compiles dynamic
        which = ", ".join(f"{path}'s took {n}" for path, n in varying.items())
        needs.append(f"make the inputs' shapes static ({which} shapes in the measured windows){SHORT_END}pad or "
                     "bucket them to a few fixed sizes: a CUDA graph replays the shapes it captured "
                     "(mode='reduce-overhead' records a graph for each new shape)")
    read_points = [p for p in points if p.synchronizing and matches(READBACK, p.operator_name)]
    if read_points:
        kinds = " and ".join(sorted({_read_kind(p.operator_name) for p in read_points}))
        reads = sorted({_where(p) for p in read_points})
        needs.append(f"move the {kinds} read(s) at {', '.join(reads)} out of the loop{SHORT_END}keep the value on "
                     "the GPU (or torch._dynamo.config.capture_scalar_outputs = True under torch.compile)")
    offloads = [p for p in points if p.synchronizing and p.offloaded]
    if offloads:
        needs.append(f"make the offload of saved activations asynchronous ({sum(p.count for p in offloads)} "
                     f"synchronising copies to the host inside the forward's operators){SHORT_END}a saved-tensor "
                     "hook that copies into pinned memory with non_blocking=True, or offload fewer tensors "
                     "(save_on_cpu around the largest activations only)")
    others = sorted({_where(p) for p in points if p.synchronizing and not p.data_dependent and not p.offloaded})
    if others:
        needs.append(f"remove the host synchronisation(s) at {', '.join(others)}{SHORT_END}a CUDA graph cannot "
                     "capture one")
    return needs


def offloads(points: Sequence[SyncPoint]) -> str:
    """What an opportunity's title adds of the offloaded activations among `points` ('' when none)."""
    calls = sum(p.count for p in points if p.offloaded and p.synchronizing)
    return f" ({calls} of them copy saved activations to the host: a saved-tensor hook's offload)" if calls else ""


def sync_finding(points: Sequence[SyncPoint]) -> Finding | None:
    """The window's synchronising places as one finding, with their sites and their idle cost."""
    waiting = [p for p in points if p.synchronizing]
    if not waiting:
        return None
    idle = sum(p.idle_after_ns or 0 for p in waiting)
    source = next((p.idle_source for p in waiting if p.idle_source), None)
    calls = sum(p.count for p in waiting)
    places = "; ".join(f"{_where(p)}: {p.api} x{p.count}" + (f", {p.idle_after_ns / 1e3:.1f} us idle after"
                                                            if p.idle_after_ns is not None else "")
                       for p in waiting[:6])
    offloaded = [p for p in waiting if p.offloaded]
    if offloaded:
        places += (f". {sum(p.count for p in offloaded)} of the calls copy to the host inside forward operators "
                   f"that copy nothing themselves ({', '.join(sorted({p.operator_name or '' for p in offloaded}))}): "
                   "the activations a saved-tensor hook offloads (torch.autograd.graph.save_on_cpu), each copied "
                   "synchronously as its operator saves it; the line named is that operator's")
    return Finding(
        kind="host_sync", title=f"{calls} call(s) at {len(waiting)} place(s) make the host wait for the GPU",
        operators=[], module_paths=list(dict.fromkeys(p.module_path for p in waiting if p.module_path)),
        kernel_ids=[], triggers=[f"host_syncs={calls}", f"sync_idle_ns={idle}", f"idle_source={source}"],
        detail=f"{places}. Each one drains the GPU's queue and leaves it idle until the host launches again; keep "
               "values on the GPU, or move the reads out of the hot loop.")
