"""Read a Kineto chrome trace (torch.profiler's export) into `TraceKernel`s and top-level `CpuOp`s.

Each kernel is tied to its launching runtime/driver call by the CUPTI correlation id, and to the
operator torch.profiler itself correlated with that launch by the External id. The stack of
operator/module/marker ranges enclosing the launch on its CPU thread is rebuilt with one sweep per thread.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import yaml
from pydantic import BaseModel, Field

from mcp_server.children.contract import MEASURE_RANGE
from mcp_server.schema.records import CpuOp, Frame, RuntimeCall, TraceKernel
from plugins.cuda_api import kind_of, synchronizing
from plugins.nvtx_names import (
    ANNOTATION_NAMESPACES,
    OPTIMIZER_PREFIXES,
    fsdp_unit,
    harness_range,
    is_operator,
    operator_frames,
)
from plugins.sequences import RangeRow, SequenceIndex, forward_origins

FORMAT_FILE = Path(__file__).with_name("trace_format.yaml")


@lru_cache(maxsize=1)
def trace_format() -> dict[str, Any]:
    """Category and argument names of the Kineto trace format (trace_format.yaml)."""
    return yaml.safe_load(FORMAT_FILE.read_text(encoding="utf-8"))


class KinetoCapture(BaseModel):
    """What one Kineto trace of the measured window holds."""

    kernels: list[TraceKernel] = Field(default_factory=list)
    cpu_ops: list[CpuOp] = Field(default_factory=list)
    memcpy_count: int = 0
    memset_count: int = 0
    window_start_ns: int | None = None
    window_end_ns: int | None = None
    warnings: list[str] = Field(default_factory=list)
    sequences: SequenceIndex = Field(
        default_factory=lambda: SequenceIndex({}, {}, {}),
        description="Forward ops and backward nodes by sequence number.",
    )
    forward_threads: list[int] = Field(default_factory=list, description="Threads of the measure range.")
    runtime_calls: list[RuntimeCall] = Field(
        default_factory=list, description="The window's synchronising, copying and setting CUDA API calls.")


@lru_cache(maxsize=1)
def _generated_kernel() -> re.Pattern[str]:
    return re.compile(trace_format()["generated_kernel"])


def classify(name: str) -> str:
    """'module' for `module:<path>` and `node:<path>` ranges and FSDP2's unit ranges, 'op' for namespaced operators
    and Inductor's generated CPU kernels, else 'annotation'."""
    harness = harness_range(name)
    if harness is not None:
        return harness[1]
    if fsdp_unit(name) is not None:
        return "module"
    if _generated_kernel().match(name):
        return "op"
    head = name.split(",", 1)[0]
    if "::" in head and head.split("::", 1)[0] not in ANNOTATION_NAMESPACES and " " not in head:
        return "op"
    return "op" if is_operator(head) else "annotation"  # a backend's collective record function, gloo:all_reduce


def _ns(us: Decimal | float | int) -> int:
    """Microseconds (parsed exactly as Decimal) to integer nanoseconds."""
    return int((Decimal(us) * trace_format()["time_unit_ns"]).to_integral_value(ROUND_HALF_EVEN))


def _triple(value: Any) -> tuple[int, int, int] | None:
    if isinstance(value, list) and len(value) == 3:
        return (int(value[0]), int(value[1]), int(value[2]))
    return None


def _shapes(args: dict[str, Any]) -> list[list[int] | None] | None:
    dims = args.get(trace_format()["args"]["input_dims"])
    if not isinstance(dims, list):
        return None
    return [list(d) if isinstance(d, list) and all(isinstance(x, int) for x in d) else None for d in dims]


def _frame(event: dict[str, Any]) -> Frame:
    name = event["name"]
    kind = classify(name)
    args = event.get("args", {})
    start = _ns(event["ts"])
    generated = _generated_kernel().match(name)
    harness = harness_range(name)
    if harness is not None:
        name = harness[0]
    elif kind == "module":
        name = fsdp_unit(name) or name
    elif generated:
        name = generated.group(1)
    return Frame(
        name=name,
        kind=kind,
        input_shapes=_shapes(args) if kind == "op" else None,
        input_dtypes=args.get(trace_format()["args"]["input_types"]) if kind == "op" else None,
        start_ns=start,
        end_ns=start + _ns(event.get("dur", 0)),
        seq=_sequence(args),
    )


def _sequence(args: dict[str, Any]) -> int | None:
    """An operator or autograd node's sequence number (-1 and absent: none)."""
    value = args.get(trace_format()["args"]["sequence"])
    return int(value) if isinstance(value, int) and value >= 0 else None


def _start_ns(frame: Frame) -> int:
    """Start of a range frame: `_frame` always sets it (Frame allows None only for frames built elsewhere)."""
    return cast(int, frame.start_ns)


def enclosing_stacks(ranges: list[Frame], points: list[int]) -> list[list[Frame]]:
    """For sorted `points`, the ranges (properly nested, one thread) enclosing each point, outermost first."""
    ordered = sorted(ranges, key=lambda f: (f.start_ns, -(f.end_ns or 0)))
    stacks: list[list[Frame]] = []
    active: list[Frame] = []
    i = 0
    for t in points:
        while i < len(ordered) and _start_ns(ordered[i]) <= t:
            frame = ordered[i]
            while active and (active[-1].end_ns or 0) < _start_ns(frame):
                active.pop()
            active.append(frame)
            i += 1
        while active and (active[-1].end_ns or 0) < t:
            active.pop()
        stacks.append([f for f in active if _start_ns(f) <= t <= (f.end_ns or 0)])
    return stacks


def _events(trace: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "X" and "ts" in event:
            yield event


def read_kineto_trace(path: Path) -> KinetoCapture:
    """Parse a Kineto chrome trace into kernels (launch order) and top-level CPU operators."""
    fmt = trace_format()
    cats, argn = fmt["categories"], fmt["args"]
    trace = json.loads(Path(path).read_text(encoding="utf-8"), parse_float=Decimal)
    capture = KinetoCapture()
    ranges: dict[int, list[Frame]] = defaultdict(list)
    launches: dict[int, dict[str, Any]] = {}
    op_by_external: dict[int, str] = {}
    kernel_events: list[dict[str, Any]] = []
    activity: dict[int, dict[str, Any]] = {}  # copies and sets on the GPU, by correlation id
    for event in _events(trace):
        cat, args = event.get("cat"), event.get("args", {})
        if cat in cats["ranges"]:
            frame = _frame(event)
            if event["name"] == MEASURE_RANGE:
                capture.window_start_ns, capture.window_end_ns = frame.start_ns, frame.end_ns
            ranges[int(event["tid"])].append(frame)
            if argn["external_id"] in args and cat == "cpu_op":
                op_by_external[int(args[argn["external_id"]])] = event["name"]
        elif cat in cats["launch"] and argn["correlation"] in args:
            launches[int(args[argn["correlation"]])] = event
        elif cat in cats["kernel"]:
            kernel_events.append(event)
        elif cat in cats["memcpy"]:
            capture.memcpy_count += 1
            if argn["correlation"] in args:
                activity[int(args[argn["correlation"]])] = event
        elif cat in cats["memset"]:
            capture.memset_count += 1
            if argn["correlation"] in args:
                activity[int(args[argn["correlation"]])] = event
    capture.kernels = _kernels(kernel_events, launches, ranges, op_by_external, capture.warnings)
    capture.sequences = forward_origins(
        RangeRow(tid, _start_ns(f), f.end_ns or _start_ns(f), f.name, f.kind, f.seq)
        for tid, f in sorted(((tid, f) for tid, frames in ranges.items() for f in frames),
                             key=lambda item: (_start_ns(item[1]), -(item[1].end_ns or 0)))
    )
    capture.forward_threads = sorted({int(e["tid"]) for e in _events(trace) if e.get("name") == MEASURE_RANGE})
    capture.cpu_ops = _top_level_ops(ranges, capture.window_end_ns)
    capture.runtime_calls = _runtime_calls(launches, activity, ranges, capture)
    return capture


def _runtime_calls(launches: dict[int, dict[str, Any]], activity: dict[int, dict[str, Any]],
                   ranges: dict[int, list[Frame]], capture: KinetoCapture) -> list[RuntimeCall]:
    """The window's synchronising, copying and setting runtime calls in call order, each with the copy or set it
    started (bytes, direction, memory kinds from the event's name) and the ranges enclosing it on its thread."""
    fmt = trace_format()
    found = []
    for corr, event in launches.items():
        kind = kind_of(event["name"])
        start = _ns(event["ts"])
        inside = capture.window_start_ns is None or (
            capture.window_start_ns <= start <= (capture.window_end_ns or start))
        if kind is not None and inside:
            found.append((start, corr, kind, event))
    found.sort(key=lambda f: (f[0], f[1]))
    by_thread: dict[int, list[int]] = defaultdict(list)
    for index, (_, _, _, event) in enumerate(found):
        by_thread[int(event["tid"])].append(index)
    stacks: dict[int, list[Frame]] = {}
    for tid, indices in by_thread.items():
        points = [found[i][0] for i in indices]
        for index, stack in zip(indices, enclosing_stacks(ranges.get(tid, []), points), strict=True):
            stacks[index] = stack
    calls = []
    for index, (start, corr, kind, event) in enumerate(found):
        call = RuntimeCall(ordinal=index, kind=kind, api=event["name"], api_start_ns=start,
                           api_end_ns=start + _ns(event.get("dur", 0)), thread=int(event["tid"]),
                           correlation_id=corr, stack=stacks.get(index, []))
        gpu = activity.get(corr)
        if gpu is not None:
            call.gpu_start_ns = _ns(gpu["ts"])
            call.gpu_end_ns = call.gpu_start_ns + _ns(gpu.get("dur", 0))
            size = gpu.get("args", {}).get(fmt["args"]["bytes"])
            call.bytes = int(size) if size is not None else None
            if (copy := re.match(fmt["memcpy_name"], gpu["name"])) is not None:
                call.copy_kind, call.src_memory, call.dst_memory = copy[1], copy[2].lower(), copy[3].lower()
            elif (memset := re.match(fmt["memset_name"], gpu["name"])) is not None:
                call.dst_memory = memset[1].lower()
        call.synchronizing = synchronizing(call.api, call.copy_kind, call.src_memory, call.dst_memory)
        calls.append(call)
    return calls


def _kernels(
    kernel_events: list[dict[str, Any]],
    launches: dict[int, dict[str, Any]],
    ranges: dict[int, list[Frame]],
    op_by_external: dict[int, str],
    warnings: list[str],
) -> list[TraceKernel]:
    argn = trace_format()["args"]
    rows = []
    for event in kernel_events:
        args = event.get("args", {})
        corr = args.get(argn["correlation"])
        launch = launches.get(int(corr)) if corr is not None else None
        launch_ts = _ns(launch["ts"]) if launch else _ns(event["ts"])
        rows.append((launch_ts, _ns(event["ts"]), event, launch))
    missing = sum(1 for r in rows if r[3] is None)
    if missing:
        warnings.append(f"{missing} kernels have no launching runtime call in the trace; ordered by GPU start")
    rows.sort(key=lambda r: (r[0], r[1]))
    by_thread: dict[int, list[int]] = defaultdict(list)
    for idx, (_, _, _, launch) in enumerate(rows):
        if launch is not None:
            by_thread[int(launch["tid"])].append(idx)
    stacks: dict[int, list[Frame]] = {}
    for tid, indices in by_thread.items():
        points = [rows[i][0] for i in indices]
        for idx, stack in zip(indices, enclosing_stacks(ranges.get(tid, []), points), strict=True):
            stacks[idx] = stack
    kernels = []
    for idx, (launch_ts, start, event, launch) in enumerate(rows):
        args = event.get("args", {})
        external = args.get(argn["external_id"])
        kernels.append(
            TraceKernel(
                ordinal=idx,
                name=event["name"],
                start_ns=start,
                duration_ns=_ns(event.get("dur", 0)),
                device_id=args.get(argn["device"]),
                stream_id=args.get(argn["stream"]),
                correlation_id=args.get(argn["correlation"]),
                grid=_triple(args.get(argn["grid"])),
                block=_triple(args.get(argn["block"])),
                registers_per_thread=args.get(argn["registers"]),
                shared_memory_bytes=args.get(argn["shared_memory"]),
                launch_thread=int(launch["tid"]) if launch else None,
                launch_start_ns=launch_ts if launch else None,
                stack=stacks.get(idx, []),
                linked_op=op_by_external.get(int(external)) if external is not None else None,
            )
        )
    return kernels


def _top_level_ops(ranges: dict[int, list[Frame]], window_end_ns: int | None = None) -> list[CpuOp]:
    """Outermost operator calls per thread: their span, their own self time (span minus directly nested
    operators), and the self time of every operator nested in them, by name (compute done below the call). An
    operator called inside an optimizer range that opened inside another operator (an optimizer stepped from a
    post-accumulate-grad hook, inside autograd's `AccumulateGrad`) makes a call of its own; the optimizer range's
    span leaves the enclosing call's. A call still open when the window ends (the step that ends it ran inside the
    call) is counted up to the window's end."""
    ops: list[CpuOp] = []
    for tid, frames in ranges.items():
        context: list[Frame] = []
        calls: list[tuple[Frame, list[int], CpuOp]] = []  # open operator frames, each with [self time], its call
        for frame in sorted(frames, key=lambda f: (f.start_ns, -(f.end_ns or 0))):
            start = _start_ns(frame)
            while context and (context[-1].end_ns or 0) < start:
                context.pop()
            while calls and (calls[-1][0].end_ns or 0) < start:
                _close(*calls.pop())
            end = frame.end_ns or start
            span = (min(end, window_end_ns) if window_end_ns is not None and start <= window_end_ns else end) - start
            # the innermost open call, unless an optimizer range opened inside it (`operator_frames` finds none then)
            enclosing = calls[-1] if calls and operator_frames(context) else None
            if frame.kind == "op":
                if enclosing is not None:
                    enclosing[1][0] -= span
                    top = enclosing[2]
                else:
                    top = CpuOp(
                        name=frame.name, start_ns=start, duration_ns=span, self_ns=span, thread=tid,
                        stack=list(context), input_shapes=frame.input_shapes, input_dtypes=frame.input_dtypes,
                        seq=frame.seq,
                    )
                    ops.append(top)
                calls.append((frame, [span], top))
            elif enclosing is not None and frame.name.startswith(OPTIMIZER_PREFIXES):
                enclosing[1][0] -= span  # the step leaves the call that ran it: its operators are calls of their own
                enclosing[2].duration_ns -= span
            context.append(frame)
        while calls:
            _close(*calls.pop())
    ops.sort(key=lambda o: o.start_ns)
    return ops


def _close(frame: Frame, self_time: list[int], top: CpuOp) -> None:
    """An operator frame ends: its self time joins its outermost call's per-operator self times (and is that
    call's own self time when the frame is the call itself)."""
    self_ns = max(self_time[0], 0)
    top.nested_self_ns[frame.name] = top.nested_self_ns.get(frame.name, 0) + self_ns
    if frame.start_ns == top.start_ns and frame.name == top.name:
        top.self_ns = self_ns
