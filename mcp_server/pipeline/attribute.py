"""Attribution: tie every window kernel to the operator call and module that launched it.

The confidence ladder (DESIGN.md): Kineto External-id correlation (high) -> NVTX enclosure (medium) ->
Inductor provenance (medium) -> unattributed (kept, never dropped). An operator call is the outermost
operator range enclosing the launch; the innermost one is kept as the kernel's `launch_op`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mcp_server.pipeline.provenance import KernelOrigin
from mcp_server.schema.profile import (
    Attribution,
    AttributionMethod,
    Confidence,
    KernelRecord,
    Metric,
    OperatorRecord,
)
from mcp_server.schema.records import CounterRecord, Frame, TraceKernel


@dataclass
class _Call:
    """Kernels of one operator call, before they become an OperatorRecord."""

    name: str
    first_ordinal: int
    module_path: str | None
    op_frame: Frame | None = None
    origin: KernelOrigin | None = None
    kernels: list[KernelRecord] = field(default_factory=list)


def _module_path(stack: list[Frame]) -> str | None:
    modules = [f.name for f in stack if f.kind == "module"]
    return modules[-1] if modules else None


def _triton_name(stack: list[Frame], kernel: TraceKernel, origins: dict[str, KernelOrigin]) -> str | None:
    """The generated kernel's name: the kernel's own name or its launch marker range's name."""
    if kernel.name in origins:
        return kernel.name
    for frame in reversed(stack):
        head = frame.name.split(",", 1)[0].strip()
        if frame.kind == "annotation" and head in origins:
            return head
    return None


def attribute_kernels(
    kernels: list[TraceKernel],
    origins: dict[str, KernelOrigin],
    window_start_ns: int,
    counters: Callable[[int], tuple[dict[str, Metric], int | None]] | None = None,
    high_confidence_links: bool = True,
) -> tuple[list[OperatorRecord], list[KernelRecord]]:
    """Group kernels into operator calls; return (operators in window order, unattributed kernels).

    `counters(ordinal)` supplies each kernel's ncu metrics and the ordinal they were propagated from.
    `high_confidence_links`: the stack comes from the same capture as the tool's own launch correlation
    (Kineto); NVTX stacks (nsys) give medium confidence.
    """
    calls: dict[tuple[object, ...], _Call] = {}
    unattributed: list[KernelRecord] = []
    for kernel in kernels:
        ops = [f for f in kernel.stack if f.kind == "op"]
        module_path = _module_path(kernel.stack)
        metrics, propagated = counters(kernel.ordinal) if counters else ({}, None)
        triton = _triton_name(kernel.stack, kernel, origins) if not ops else None
        if ops:
            linked = high_confidence_links and kernel.linked_op == ops[-1].name
            attribution = Attribution(
                method=AttributionMethod.KINETO_CORRELATION if linked else AttributionMethod.NVTX_ENCLOSURE,
                confidence=Confidence.HIGH if linked else Confidence.MEDIUM,
                launch_op=ops[-1].name,
            )
            key: tuple[object, ...] = ("op", kernel.launch_thread, ops[0].start_ns, ops[0].name)
            call = calls.setdefault(key, _Call(ops[0].name, kernel.ordinal, module_path, op_frame=ops[0]))
        elif triton is not None:
            origin = origins[triton]
            attribution = Attribution(
                method=AttributionMethod.INDUCTOR_PROVENANCE, confidence=Confidence.MEDIUM,
                detail=f"fused: {', '.join(origin.aten_ops)}",
            )
            module_path = origin.module_path
            fused = _Call(triton, kernel.ordinal, module_path, origin=origin)
            call = calls.setdefault(("fused", kernel.ordinal), fused)
        else:
            attribution = Attribution(method=AttributionMethod.UNATTRIBUTED, confidence=Confidence.NONE)
            call = None
        record = KernelRecord(
            kernel_id=kernel.ordinal, kernel_name=kernel.name, mangled_name=kernel.mangled_name,
            device_id=kernel.device_id, stream_id=kernel.stream_id, correlation_id=kernel.correlation_id,
            start_ns=kernel.start_ns - window_start_ns, duration_ns=kernel.duration_ns,
            grid=kernel.grid, block=kernel.block, registers_per_thread=kernel.registers_per_thread,
            shared_memory_bytes=kernel.shared_memory_bytes, module_path=module_path,
            attribution=attribution, metrics=metrics, propagated_from=propagated,
        )
        if call is None:
            unattributed.append(record)
        else:
            call.kernels.append(record)
    return _operators(sorted(calls.values(), key=lambda c: c.first_ordinal)), unattributed


def _operators(calls: list[_Call]) -> list[OperatorRecord]:
    seen: dict[str, int] = {}
    operators = []
    for call in calls:
        index = seen.get(call.name, 0)
        seen[call.name] = index + 1
        frame = call.op_frame
        operators.append(
            OperatorRecord(
                operator_id=f"{call.name}#{index}",
                operator_name=call.name,
                call_index=index,
                module_path=call.module_path,
                input_shapes=frame.input_shapes if frame else None,
                input_dtypes=frame.input_dtypes if frame else None,
                is_fused=call.origin is not None,
                fused_operators=list(call.origin.aten_ops) if call.origin else [],
                kernels=call.kernels,
            )
        )
    return operators


def join_counters(
    kernels: list[TraceKernel], records: list[CounterRecord], deduplicated: bool
) -> tuple[dict[int, tuple[dict[str, Metric], int | None]], list[str]]:
    """Match ncu records to timeline kernels; return ordinal -> (metrics, propagated_from) and mismatches.

    Without deduplication the i-th ncu record is the i-th launch in the window, and names must agree.
    With per-launch-config deduplication each (name, grid, block) was replayed once, at its first launch;
    every later identical launch gets a copy marked with the ordinal it was propagated from.
    """
    problems: list[str] = []
    joined: dict[int, tuple[dict[str, Metric], int | None]] = {}
    if not deduplicated:
        if len(records) != len(kernels):
            problems.append(f"ncu profiled {len(records)} kernels, the timeline has {len(kernels)} in the window")
        for kernel, record in zip(kernels, records, strict=False):
            if not _same_kernel(kernel, record):
                problems.append(f"launch {kernel.ordinal}: timeline ran {kernel.name!r}, ncu profiled {record.name!r}")
                continue
            joined[kernel.ordinal] = (record.metrics, None)
        return joined, problems
    first: dict[tuple[object, ...], int] = {}
    queue = list(records)
    by_config: dict[tuple[object, ...], CounterRecord] = {}
    for kernel in kernels:
        config = (kernel.name, kernel.grid, kernel.block)
        if config in first:
            source = first[config]
            joined[kernel.ordinal] = (by_config[config].metrics, source)
            continue
        if not queue:
            problems.append(f"launch {kernel.ordinal} ({kernel.name[:60]}): no ncu record left to match")
            continue
        record = queue.pop(0)
        if not _same_kernel(kernel, record):
            problems.append(
                f"launch {kernel.ordinal}: timeline ran {kernel.name[:60]!r}, ncu profiled {record.name[:60]!r}"
            )
            continue
        first[config] = kernel.ordinal
        by_config[config] = record
        joined[kernel.ordinal] = (record.metrics, None)
    if queue:
        problems.append(f"{len(queue)} ncu records matched no launch in the timeline window")
    return joined, problems


def _same_kernel(kernel: TraceKernel, record: CounterRecord) -> bool:
    if kernel.mangled_name and record.mangled_name:
        return kernel.mangled_name == record.mangled_name
    short = record.name.split("(", 1)[0].strip()
    return kernel.name == record.name or short in kernel.name or kernel.name.split("(", 1)[0].endswith(short)
