"""Operator calls inside compiled graphs: each generated call site's module for the calls a compiled graph made
(`extern_module_paths`), and operator calls for the library kernels a CUDA graph replayed with no operator range
around them, placed by the generated call()'s launch order (`align_graph_replays`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mcp_server.assemble.provenance import ExternCall, KernelOrigin, Provenance
from mcp_server.schema.profile import Attribution, AttributionMethod, Confidence, KernelRecord

_set = object.__setattr__


@dataclass(slots=True)
class Call:
    """Kernels of one operator call, before they become an OperatorRecord."""

    name: str
    first_ordinal: int
    module_path: str | None
    input_shapes: list[list[int] | None] | None = None
    input_dtypes: list[str | None] | None = None
    origin: KernelOrigin | None = None
    graph_call: tuple[object, ...] | None = None
    kernels: list[KernelRecord] = field(default_factory=list)
    phase: str | None = None
    call_site: str | None = None
    autograd_node: str | None = None
    forward_op: str | None = None
    graph_key: str | None = None  # the compiled graph's `## Call CompiledFxGraph` range name
    recomputed: bool = False


def extern_module_paths(calls: list[Call], provenance: Provenance, root: str | None = None) -> None:
    """Give the operator calls inside a compiled graph the module of their own call site.

    Within one call of a compiled graph, its launches run in the order of the generated call(): library
    (extern) calls and generated kernels alike. The generated module whose launch sequence contains the
    observed one, in order, supplies each call site's module — so a generated kernel Inductor reuses in a
    later layer gets that layer's module, not the one of its definition's first use. A library call keeps the
    module range it ran in unless that range is the model's own (`root`), or the module whose forward the graphs
    traced (`Provenance.traced_inside`: a DDP wrapper's `module`): a model compiled whole runs inside its own range
    only (its call is eager, its forward compiled), and its call site's module is the finer one.
    """
    traced = provenance.traced_inside or root
    groups: dict[tuple[object, ...], list[Call]] = {}
    for call in calls:
        if call.graph_call is not None:
            groups.setdefault(call.graph_call, []).append(call)
    for whole in groups.values():
        graph = provenance.graph(whole[0].graph_key)
        # the graph's own launch sequence when the capture recorded it; every generated module's otherwise
        sequences = [graph.extern_calls] if graph is not None else provenance.extern_calls
        # The whole launch sequence when the generated code lists it; the library calls alone otherwise.
        # Calls the generated code does not make (e.g. CUDA-graph input copies) are left out of the match.
        matched, group = None, whole
        for sequence in sequences:
            names = {site.operator_name for site in sequence}
            known = [c for c in whole if c.name in names]
            for group in (known, [c for c in known if c.origin is None]):
                matched = _in_order(group, sequence) if group else None
                if matched is not None:
                    break
            if matched is not None:
                break
        for call, site in zip(group, matched or [], strict=False):
            ranged = call.module_path if call.module_path not in (root, traced) else None
            path = site.module_path if call.origin is not None else ranged or site.module_path
            call.call_site = site.call_site or call.call_site
            if path and path != call.module_path:
                call.module_path = path
                for record in call.kernels:
                    _set(record, "module_path", path)


_REPLAY_DETAIL = "CUDA graph replay: placed by the generated call()'s launch order"


def align_graph_replays(
    calls: list[Call], orphans: dict[tuple[object, ...], list[KernelRecord]], sequences: list[list[ExternCall]]
) -> list[Call]:
    """Operator calls for library kernels a CUDA graph replayed (no operator range encloses them).

    The graph replays the generated call()'s launches in order. Its generated kernels, identified by name,
    anchor the sequence; the library kernels between two anchors belong to the extern calls between the
    matching call sites: all of them to the one extern call there, or one per call in order (the rest to the
    last) when there are several. Kernels with no extern call between their anchors stay unattributed.
    """
    aligned: list[Call] = []
    attribution = Attribution(
        method=AttributionMethod.INDUCTOR_PROVENANCE, confidence=Confidence.MEDIUM, detail=_REPLAY_DETAIL
    )
    for graph, kernels in orphans.items():
        anchors = [c for c in calls if c.graph_call == graph and c.origin is not None]
        for sequence in sequences:
            sites = _site_indices([a.name for a in anchors], sequence)
            if sites is None:
                continue
            site_of = {id(a): i for a, i in zip(anchors, sites, strict=True)}
            gaps: dict[tuple[int, int], list[KernelRecord]] = {}
            for record in kernels:
                before = [a for a in anchors if a.first_ordinal < record.kernel_id]
                after = [a for a in anchors if a.first_ordinal > record.kernel_id]
                low = site_of[id(before[-1])] if before else -1
                high = site_of[id(after[0])] if after else len(sequence)
                gaps.setdefault((low, high), []).append(record)
            for (low, high), records in gaps.items():
                externs = [site for site in sequence[low + 1:high] if site.kind == "extern"]
                if not externs:
                    continue
                shares = [records[i:i + 1] for i in range(len(externs) - 1)] + [records[len(externs) - 1:]]
                for site, share in zip(externs, shares, strict=True):
                    if not share:
                        continue
                    call = Call(site.operator_name, share[0].kernel_id, site.module_path, graph_call=graph,
                                phase=share[0].phase, call_site=site.call_site)
                    for record in share:
                        _set(record, "attribution", attribution)
                        _set(record, "module_path", site.module_path)
                        call.kernels.append(record)
                    aligned.append(call)
            break
    return aligned


def _site_indices(kernel_names: list[str], sequence: list[ExternCall]) -> list[int] | None:
    """Indices of the generated-kernel call sites the names launch, in order, or None when they do not fit."""
    indices, position = [], 0
    for name in kernel_names:
        while position < len(sequence) and not (
            sequence[position].kind == "triton" and sequence[position].operator_name == name
        ):
            position += 1
        if position == len(sequence):
            return None
        indices.append(position)
        position += 1
    return indices


def _in_order(group: list[Call], sequence: list[ExternCall]) -> list[ExternCall] | None:
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
