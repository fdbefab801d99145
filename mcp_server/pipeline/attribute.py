"""Attribution: tie every window kernel to the operator call and module that launched it.

The confidence ladder (DESIGN.md): Kineto External-id correlation (high) -> NVTX enclosure (medium) ->
Inductor provenance (medium) -> unattributed (kept, never dropped). An operator call is the outermost
operator range enclosing the launch; the innermost one is kept as the kernel's `launch_op`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mcp_server.pipeline.provenance import GRAPH_CALL_PREFIX, ExternCall, KernelOrigin, Provenance
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
    graph_call: tuple[object, ...] | None = None
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
    provenance: Provenance,
    window_start_ns: int,
    counters: Callable[[int], tuple[dict[str, Metric], int | None]] | None = None,
    high_confidence_links: bool = True,
) -> tuple[list[OperatorRecord], list[KernelRecord]]:
    """Group kernels into operator calls; return (operators in window order, unattributed kernels).

    `counters(ordinal)` supplies each kernel's ncu metrics and the ordinal they were propagated from.
    `high_confidence_links`: the stack comes from the same capture as the tool's own launch correlation
    (Kineto); NVTX stacks (nsys) give medium confidence.
    """
    origins = provenance.kernels
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
            graph = next((f for f in kernel.stack if f.name.startswith(GRAPH_CALL_PREFIX)), None)
            graph_key = (kernel.launch_thread, graph.start_ns) if graph is not None else None
            call = calls.setdefault(
                key, _Call(ops[0].name, kernel.ordinal, module_path, op_frame=ops[0], graph_call=graph_key)
            )
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
    ordered = sorted(calls.values(), key=lambda c: c.first_ordinal)
    _extern_module_paths(ordered, provenance.extern_calls)
    return _operators(ordered), unattributed


def _extern_module_paths(calls: list[_Call], sequences: list[list[ExternCall]]) -> None:
    """Give library-kernel operator calls inside a compiled graph the module of their FX source node.

    Within one call of a compiled graph, its extern calls run in the order of the generated call(); the
    generated module whose extern sequence matches the observed operator sequence supplies the paths.
    """
    groups: dict[tuple[object, ...], list[_Call]] = {}
    for call in calls:
        if call.graph_call is not None and call.origin is None:
            groups.setdefault(call.graph_call, []).append(call)
    for group in groups.values():
        for sequence in sequences:
            matched = _in_order(group, sequence)
            if matched is not None:
                for call, extern in zip(group, matched, strict=True):
                    call.module_path = call.module_path or extern.module_path
                break


def _in_order(group: list[_Call], sequence: list[ExternCall]) -> list[ExternCall] | None:
    """The extern calls the group's operators are, in order (some externs may launch no kernel), or None."""
    matched, position = [], 0
    for call in group:
        while position < len(sequence) and sequence[position].operator_name != call.name:
            position += 1
        if position == len(sequence):
            return None
        matched.append(sequence[position])
        position += 1
    return matched


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
    kernels: list[TraceKernel], records: list[CounterRecord], deduplicated: bool, filtered: bool = False
) -> tuple[dict[int, tuple[dict[str, Metric], int | None]], list[str]]:
    """Match ncu records to timeline kernels; return ordinal -> (metrics, propagated_from) and mismatches.

    ncu replays in launch order, so each record belongs to the next timeline launch, at or after the
    previous match, of the same kernel (mangled name, grid, block). Without deduplication or filters every
    launch must be matched in turn: a launch passed over is a disagreement between the captures and is
    reported. With per-launch-config deduplication, ncu replayed a launch only when it judged its
    configuration new; each launch it passed over gets the counters of the nearest replayed launch of the
    same configuration (the earlier one when there is one), marked `propagated_from`. Every record that
    matches no launch, and every launch left without counters, is reported, never papered over.
    """
    problems: list[str] = []
    joined: dict[int, tuple[dict[str, Metric], int | None]] = {}
    position = 0
    replayed_configs: set[tuple[object, ...]] = set()
    for record in records:
        j = position
        while j < len(kernels) and not _same_kernel(kernels[j], record):
            # Passing over a launch is expected only for a configuration ncu already replayed.
            if not filtered and not (deduplicated and _config(kernels[j]) in replayed_configs):
                problems.append(
                    f"launch {kernels[j].ordinal}: timeline ran {_short(kernels[j].name)}, "
                    f"ncu profiled {_short(record.name)} next"
                )
            j += 1
        if j == len(kernels):
            problems.append(f"ncu record {record.ordinal} ({_short(record.name)}) matches no later window launch")
            continue
        joined[kernels[j].ordinal] = (record.metrics, None)
        replayed_configs.add(_config(kernels[j]))
        position = j + 1
    if deduplicated:
        _propagate(kernels, joined)
    if not filtered:
        missing = [k for k in kernels if k.ordinal not in joined]
        if missing:
            problems.append(
                f"{len(missing)} window launches have no ncu counters (first: launch {missing[0].ordinal} "
                f"{_short(missing[0].name)})"
            )
    return joined, problems


def _propagate(kernels: list[TraceKernel], joined: dict[int, tuple[dict[str, Metric], int | None]]) -> None:
    """Copy counters to launches ncu passed over from the nearest replayed launch of the same configuration."""
    replayed: dict[tuple[object, ...], list[int]] = {}
    for kernel in kernels:
        if kernel.ordinal in joined:
            replayed.setdefault(_config(kernel), []).append(kernel.ordinal)
    for kernel in kernels:
        if kernel.ordinal in joined:
            continue
        sources = replayed.get(_config(kernel))
        if sources:
            earlier = [s for s in sources if s < kernel.ordinal]
            source = earlier[-1] if earlier else sources[0]
            joined[kernel.ordinal] = (joined[source][0], source)


def _short(name: str) -> str:
    return repr(name if len(name) <= 60 else name[:59] + "…")


def _config(kernel: TraceKernel) -> tuple[object, ...]:
    return (kernel.mangled_name or kernel.name, kernel.grid, kernel.block)


def _same_kernel(kernel: TraceKernel, record: CounterRecord) -> bool:
    """Same function (mangled names when both tools give one) and, when both are known, same grid and block."""
    for mine, theirs in ((kernel.grid, record.grid), (kernel.block, record.block)):
        if mine is not None and theirs is not None and tuple(mine) != tuple(theirs):
            return False
    if kernel.mangled_name and record.mangled_name:
        return kernel.mangled_name == record.mangled_name
    return " ".join(kernel.name.split()) == " ".join(record.name.split())
