"""Attribution: tie every window kernel to the operator call and module that launched it.

The confidence ladder (DESIGN.md): Kineto External-id correlation (high) -> NVTX enclosure (medium) ->
Inductor provenance (medium) -> unattributed (kept, never dropped). An operator call is the outermost
operator range enclosing the launch; the innermost one is kept as the kernel's `launch_op`. A kernel the workload
launched itself with no operator range around it (its own Triton kernel, an extension's launch) inside its model, a
backward node or a line of its own is a call of its own, named by the kernel (NVTX enclosure).

Kernels are consumed one at a time (a list, or a reader's stream of a million), and their records are built
without re-validating values the readers already typed. Records hold no private copy of what repeats: kernels
of equal attribution share one `Attribution`, and all kernel records one (complete) fields-set.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from mcp_server.assemble.aggregate import aggregate_into, counted_fields, finish_record
from mcp_server.assemble.graph_calls import Call, align_graph_replays, extern_module_paths
from mcp_server.assemble.phases import Context, FrameLike, work_of
from mcp_server.assemble.provenance import GRAPH_CALL_PREFIX, KernelOrigin, Provenance, graph_key
from mcp_server.children.contract import GRAPH_CAPTURE_RANGE
from mcp_server.schema.profile import (
    AggregatedMetrics,
    Attribution,
    AttributionMethod,
    Confidence,
    KernelRecord,
    Metric,
    OperatorRecord,
)
from mcp_server.schema.records import TraceKernel
from plugins.ncu import keys
from plugins.nvtx_names import operator_frames

CAPTURED_DETAIL = "replayed from a CUDA graph the workload captured: the ranges open when its node was captured"
DIRECT_DETAIL = ("launched by the workload's own code with no operator range around it (a Triton kernel, an "
                 "extension's launch): a call of its own, named by the kernel")
Counters = Callable[[int], tuple[dict[str, Metric], int | None, str | None]]


class KernelLike(keys.LaunchLike, Protocol):
    """What attribution reads of a timeline kernel (beyond what the ncu join does): `TraceKernel`, or the nsys
    reader's light `WindowKernel`."""

    @property
    def start_ns(self) -> int: ...
    @property
    def duration_ns(self) -> int: ...
    @property
    def device_id(self) -> int | None: ...
    @property
    def correlation_id(self) -> int | None: ...
    @property
    def registers_per_thread(self) -> int | None: ...
    @property
    def launch_thread(self) -> int | None: ...
    @property
    def stack(self) -> Sequence[FrameLike]: ...
    @property
    def linked_op(self) -> str | None: ...
    @property
    def from_graph(self) -> bool: ...  # replayed from a CUDA graph


def _triton_range(stack: Sequence[FrameLike], *origins: dict[str, KernelOrigin]) -> str | None:
    """The innermost launch marker range naming a generated kernel."""
    for frame in reversed(stack):
        head = frame.name.split(",", 1)[0].strip()
        if frame.kind == "annotation" and any(head in known for known in origins):
            return head
    return None


class _StackFacts:
    """What attribution needs of one stack, worked out once for all the kernels launched under it."""

    __slots__ = ("outer_op", "launch_op", "module_path", "graph", "triton", "attribution", "phase", "call_site",
                 "autograd_node", "forward_op", "graph_origins", "recomputed", "direct")

    def __init__(self, stack: Sequence[FrameLike], provenance: Provenance, known: _Attributions, context: Context,
                 thread: int | None) -> None:
        ops = operator_frames(stack)
        self.outer_op = ops[0] if ops else None
        self.launch_op = ops[-1].name if ops else None
        work = work_of(stack, context, thread)
        self.module_path, self.phase, self.call_site = work.module_path, work.phase, work.call_site
        self.autograd_node, self.forward_op, self.recomputed = work.autograd_node, work.forward_op, work.recomputed
        self.graph = next((f for f in stack if f.name.startswith(GRAPH_CALL_PREFIX)), None)
        graph = provenance.graph(self.graph.name) if self.graph is not None else None
        self.graph_origins = graph.kernels if graph is not None else provenance.kernels
        self.triton = None if ops else _triton_range(stack, self.graph_origins, provenance.kernels)
        # a launch of the workload's own, with no operator range: inside its model, a backward node or its own line
        self.direct = not ops and self.graph is None and bool(
            self.module_path or self.autograd_node or self.call_site)
        # NVTX enclosure: the attribution of every kernel under this stack the tool itself did not link; a kernel
        # replayed from a CUDA graph the workload captured is enclosed by the ranges open at its capture
        captured = any(f.name == GRAPH_CAPTURE_RANGE for f in stack)
        self.attribution = known.operator(ops[-1].name, False, CAPTURED_DETAIL if captured else None) if ops \
            else None


_OPERATOR_FIELDS = frozenset(OperatorRecord.model_fields)
_BUILT_OPERATOR_FIELDS = frozenset({
    "operator_id", "operator_name", "call_index", "module_path", "input_shapes", "input_dtypes", "is_fused",
    "fused_operators", "kernels", "aggregated", "phase", "call_site", "autograd_node", "forward_op",
    "compiled_graph", "host_start_ns", "collective", "collective_seq", "collective_modules", "recomputed",
})
_KERNEL_FIELDS = frozenset(KernelRecord.model_fields)
_BUILT_KERNEL_FIELDS = frozenset({
    "kernel_id", "kernel_name", "mangled_name", "device_id", "stream_id", "correlation_id", "start_ns", "duration_ns",
    "grid", "block", "registers_per_thread", "shared_memory_bytes", "module_path", "attribution", "metrics",
    "propagated_from", "propagation", "unprofiled_gap_ns", "phase",
})
if _KERNEL_FIELDS != _BUILT_KERNEL_FIELDS or _OPERATOR_FIELDS != _BUILT_OPERATOR_FIELDS:
    raise ImportError("KernelRecord/OperatorRecord fields changed: update _kernel_record and _operators")
_set = object.__setattr__


def _kernel_record(
    kernel: KernelLike, start_ns: int, module_path: str | None, attribution: Attribution,
    metrics: dict[str, Metric], propagated: int | None, fields_set: set[str], phase: str | None = None,
    propagation: str | None = None,
) -> KernelRecord:
    """KernelRecord(...) of already typed values, without validation (a million of them: about 2 us each)."""
    record = KernelRecord.__new__(KernelRecord)
    _set(record, "kernel_id", kernel.ordinal)
    _set(record, "kernel_name", kernel.name)
    _set(record, "mangled_name", kernel.mangled_name)
    _set(record, "device_id", kernel.device_id)
    _set(record, "stream_id", kernel.stream_id)
    _set(record, "correlation_id", kernel.correlation_id)
    _set(record, "start_ns", start_ns)
    _set(record, "duration_ns", kernel.duration_ns)
    _set(record, "grid", kernel.grid)
    _set(record, "block", kernel.block)
    _set(record, "registers_per_thread", kernel.registers_per_thread)
    _set(record, "shared_memory_bytes", kernel.shared_memory_bytes)
    _set(record, "module_path", module_path)
    _set(record, "attribution", attribution)
    _set(record, "metrics", metrics)
    _set(record, "propagated_from", propagated)
    _set(record, "propagation", propagation)
    _set(record, "unprofiled_gap_ns", None)
    _set(record, "phase", phase)
    finish_record(record, fields_set)
    return record


class _Attributions:
    """One Attribution per distinct (method, confidence, launch_op, detail), built as attribute_kernels always has."""

    def __init__(self) -> None:
        self.known: dict[tuple[Any, ...], Attribution] = {}
        self.none = Attribution(method=AttributionMethod.UNATTRIBUTED, confidence=Confidence.NONE)

    def operator(self, launch_op: str, linked: bool, detail: str | None = None) -> Attribution:
        key = ("op", launch_op, linked, detail)
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = Attribution(
                method=AttributionMethod.KINETO_CORRELATION if linked else AttributionMethod.NVTX_ENCLOSURE,
                confidence=Confidence.HIGH if linked else Confidence.MEDIUM,
                launch_op=launch_op, detail=detail,
            )
        return found

    def direct(self) -> Attribution:
        found = self.known.get(("direct",))
        if found is None:
            found = self.known[("direct",)] = Attribution(
                method=AttributionMethod.NVTX_ENCLOSURE, confidence=Confidence.MEDIUM, detail=DIRECT_DETAIL)
        return found

    def fused(self, origin: KernelOrigin) -> Attribution:
        detail = f"fused: {', '.join(origin.aten_ops)}"
        key = ("fused", detail)
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = Attribution(
                method=AttributionMethod.INDUCTOR_PROVENANCE, confidence=Confidence.MEDIUM, detail=detail
            )
        return found


def attribute_kernels(
    kernels: list[TraceKernel],
    provenance: Provenance,
    window_start_ns: int,
    counters: Counters | None = None,
    high_confidence_links: bool = True,
    context: Context | None = None,
) -> tuple[list[OperatorRecord], list[KernelRecord]]:
    """Group kernels into operator calls; return (operators in window order, unattributed kernels).

    `counters(ordinal)` supplies each kernel's ncu metrics and the ordinal they were propagated from.
    `high_confidence_links`: the stack comes from the same capture as the tool's own launch correlation
    (Kineto); NVTX stacks (nsys) give medium confidence. `context`: the forward ops by sequence number and the
    model's own module path, for backward and optimizer work.
    """
    return attribute_stream(kernels, provenance, window_start_ns, counters, high_confidence_links, for_profile=False,
                            context=context)


def attribute_stream(
    kernels: Iterable[KernelLike],
    provenance: Provenance,
    window_start_ns: int,
    counters: Counters | None = None,
    high_confidence_links: bool = True,
    for_profile: bool = True,
    context: Context | None = None,
    operator_keys: dict[tuple[object, ...], str] | None = None,
) -> tuple[list[OperatorRecord], list[KernelRecord]]:
    """`attribute_kernels` over any iterable of kernels (a reader's stream), in one pass.

    `for_profile`: the records go into a profile, read-only. Each operator also carries `aggregate(op.kernels)`
    as the assemblers set it, and values that repeat by the million are shared: equal input shapes are one
    list, the aggregated blocks one fields-set. `operator_keys`, when given, receives the operator_id of each
    operator range's call: ("op", thread, the outermost operator range's start, its name) -> operator_id.
    """
    context = context or Context(root_module=provenance.root_module)
    calls: dict[tuple[object, ...], Call] = {}
    unattributed: list[KernelRecord] = []
    attributions = _Attributions()
    fields_set = set(_KERNEL_FIELDS)  # every field is set: shared, it can never change
    facts: _StackFacts | None = None
    last_stack: Sequence[FrameLike] | None = None
    last_key: tuple[object, ...] | None = None
    call: Call | None = None
    shapes_seen: dict[object, list[list[int] | None]] = {}
    orphans: dict[tuple[object, ...], list[KernelRecord]] = {}
    orphan_graph: tuple[object, ...] | None = None
    for kernel in kernels:
        stack = kernel.stack
        if stack is not last_stack or facts is None:
            facts = _StackFacts(stack, provenance, attributions, context, kernel.launch_thread)
            last_stack = stack
        if counters is not None:
            metrics, propagated, propagation = counters(kernel.ordinal)
            metrics = dict(metrics)
        else:
            metrics, propagated, propagation = {}, None, None
        outer = facts.outer_op
        module_path = facts.module_path
        if outer is not None:
            attribution = facts.attribution
            assert attribution is not None and facts.launch_op is not None  # an enclosing operator range: both set
            if high_confidence_links and kernel.linked_op == facts.launch_op:
                attribution = attributions.operator(facts.launch_op, True)
            key: tuple[object, ...] = ("op", kernel.launch_thread, outer.start_ns, outer.name)
            if key != last_key:
                call = calls.get(key)
                if call is None:
                    graph = facts.graph
                    graph_key = (kernel.launch_thread, graph.start_ns) if graph is not None else None
                    shapes = _copy_shapes(outer.input_shapes)
                    if for_profile and shapes is not None:
                        shapes = shapes_seen.setdefault(_frozen(shapes), shapes)
                    call = calls[key] = Call(
                        outer.name, kernel.ordinal, module_path, shapes,
                        None if outer.input_dtypes is None else list(outer.input_dtypes), graph_call=graph_key,
                        phase=facts.phase, call_site=facts.call_site, autograd_node=facts.autograd_node,
                        forward_op=facts.forward_op, graph_key=graph.name if graph is not None else None,
                        recomputed=facts.recomputed,
                    )
                last_key = key
        else:
            origins = facts.graph_origins
            triton = kernel.name if kernel.name in origins or kernel.name in provenance.kernels else facts.triton
            last_key = None
            if triton is not None:
                origin = origins.get(triton) or provenance.kernels[triton]
                attribution = attributions.fused(origin)
                module_path = origin.module_path or module_path
                graph = facts.graph
                graph_key = (kernel.launch_thread, graph.start_ns) if graph is not None else None
                fused = Call(triton, kernel.ordinal, module_path, origin=origin, graph_call=graph_key,
                             phase=facts.phase, call_site=origin.call_site or facts.call_site,
                             autograd_node=facts.autograd_node, forward_op=facts.forward_op,
                             graph_key=graph.name if graph is not None else None, recomputed=facts.recomputed)
                call = calls.setdefault(("fused", kernel.ordinal), fused)
            elif facts.direct and not kernel.from_graph and context.records_operators(
                    kernel.launch_thread, facts.autograd_node is not None):
                attribution = attributions.direct()
                call = calls.setdefault(("direct", kernel.ordinal), Call(
                    kernel.name, kernel.ordinal, module_path, phase=facts.phase, call_site=facts.call_site,
                    autograd_node=facts.autograd_node, forward_op=facts.forward_op, recomputed=facts.recomputed))
            else:
                attribution, call = attributions.none, None
                if facts.graph is not None:  # a library kernel replayed by a CUDA graph: aligned below
                    orphan_graph = (kernel.launch_thread, facts.graph.start_ns)
        record = _kernel_record(
            kernel, kernel.start_ns - window_start_ns, module_path, attribution, metrics, propagated, fields_set,
            facts.phase, propagation,
        )
        if call is None:
            unattributed.append(record)
            if orphan_graph is not None:
                orphans.setdefault(orphan_graph, []).append(record)
                orphan_graph = None
        else:
            call.kernels.append(record)
    ordered = sorted(calls.values(), key=lambda c: c.first_ordinal)
    keyed = [(key, call) for key, call in calls.items() if key[0] == "op"] if operator_keys is not None else []
    calls.clear()
    if orphans:
        aligned = align_graph_replays(ordered, orphans, provenance.extern_calls)
        if aligned:
            placed = {id(r) for c in aligned for r in c.kernels}
            unattributed = [r for r in unattributed if id(r) not in placed]
            ordered = sorted(ordered + aligned, key=lambda c: c.first_ordinal)
    extern_module_paths(ordered, provenance, context.root_module)
    operators = _operators(ordered, for_profile)
    if operator_keys is not None:
        ids = {id(call): op.operator_id for call, op in zip(ordered, operators, strict=True)}
        operator_keys.update((key, ids[id(call)]) for key, call in keyed)
    return operators, unattributed


def _copy_shapes(shapes: list[list[int] | None] | None) -> list[list[int] | None] | None:
    """A copy of a frame's input shapes, as validating them into an OperatorRecord makes."""
    return None if shapes is None else [None if dims is None else list(dims) for dims in shapes]


def _frozen(shapes: list[list[int] | None]) -> object:
    """Input shapes as a dict key."""
    return tuple(None if dims is None else tuple(dims) for dims in shapes)


def _operators(calls: list[Call], for_profile: bool) -> list[OperatorRecord]:
    """OperatorRecords of the calls in window order, as OperatorRecord(...) builds them (no re-validation).

    `for_profile`: `aggregated` is set as the assemblers set it.
    """
    seen: dict[str, int] = {}
    operators = []
    complete = set(_OPERATOR_FIELDS)  # every field set: shared, it can never change
    given = _OPERATOR_FIELDS - {"aggregated"}
    counted = counted_fields()
    for call in calls:
        index = seen.get(call.name, 0)
        seen[call.name] = index + 1
        op = OperatorRecord.__new__(OperatorRecord)
        _set(op, "operator_id", f"{call.name}#{index}")
        _set(op, "operator_name", call.name)
        _set(op, "call_index", index)
        _set(op, "module_path", call.module_path)
        _set(op, "input_shapes", call.input_shapes)
        _set(op, "input_dtypes", call.input_dtypes)
        _set(op, "is_fused", call.origin is not None)
        _set(op, "fused_operators", list(call.origin.aten_ops) if call.origin else [])
        _set(op, "kernels", call.kernels)
        _set(op, "aggregated", aggregate_into(call.kernels, counted) if for_profile else AggregatedMetrics())
        _set(op, "phase", call.phase)
        _set(op, "call_site", call.call_site)
        _set(op, "autograd_node", call.autograd_node)
        _set(op, "forward_op", call.forward_op)
        _set(op, "compiled_graph", graph_key(call.graph_key))
        _set(op, "recomputed", call.recomputed)
        for unset in ("host_start_ns", "collective", "collective_seq", "collective_modules"):  # set later, if ever
            _set(op, unset, None)
        finish_record(op, complete if for_profile else set(given))
        operators.append(op)
    return operators
