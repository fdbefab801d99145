"""Forward operators by autograd sequence number, from any tool's ranges (NVTX or Kineto).

Autograd numbers each node it creates in the forward pass with the running sequence number of the creating
thread; `emit_nvtx` and torch.profiler tag each forward operator range with the number current at its start
(`seq`), and each backward node's range with the number of the node it runs. So the forward op that created a
node is the last operator range, outside any backward, that started with the node's number on its thread. Its
outermost operator, innermost module and innermost call site are what the backward work differentiates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, TypeVar

BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
ACCUMULATE_GRAD = "AccumulateGrad"
T = TypeVar("T")
# A custom autograd.Function's apply is a range named by its class, no namespace ("CompiledFunction, seq = 750": a
# compiled graph's forward): an annotation to the classifier, but the forward call its backward node differentiates.
FORWARD_KINDS = ("op", "annotation")


class ForwardOrigin(NamedTuple):
    """What a backward node differentiates: the forward call's outermost operator, module and call site."""

    op: str
    module_path: str | None
    call_site: str | None
    recomputed: bool = False  # a module's forward run again inside a backward node (reentrant checkpointing)
    creator: str | None = None  # the innermost operator that started with the number: the one that made the node
    inside: str | None = None  # the node a backward's call ran in (`AddmmBackward0`), for a call of a second backward


class RangeRow(NamedTuple):
    """One classified range of one thread: its span, name, kind ('op', 'module', 'site', 'annotation') and seq."""

    thread: int
    start: int
    end: int
    name: str
    kind: str
    seq: int | None


class SequenceIndex(NamedTuple):
    """Forward origins by (thread, seq), and the seq of each backward node by (thread, its marker's start).

    `derived`: operators a backward node ran while building a graph of its own (`create_graph=True`: a gradient
    penalty, a Hessian-vector product; a checkpointed call run again) by (thread, seq), with the seq of that node:
    a node of that graph differentiates such an operator, in its own module (a call run again) or else in the module
    and at the call site of the first node's forward call."""

    origins: dict[tuple[int, int], ForwardOrigin]
    nodes: dict[tuple[int, int], int]
    derived: dict[tuple[int, int], tuple[int, ForwardOrigin]]


def forward_origins(rows: Iterable[RangeRow]) -> SequenceIndex:
    """The sequence index of rows sorted by (start, end descending).

    A backward node's own range (`AddmmBackward0, seq = N`) sits directly in its engine marker
    (`autograd::engine::evaluate_function: AddmmBackward0`); work the engine does after the node returns (e.g.
    reducing a broadcast gradient with `aten::sum`) is in the marker only, so the marker's start keys the node.
    A parameter's AccumulateGrad is keyed to the node that ran just before it on its thread (an inference: the
    engine runs it right after the node that produced its gradient).
    """
    stacks: dict[int, list[RangeRow]] = {}
    found: dict[tuple[int, int], ForwardOrigin] = {}
    nodes: dict[tuple[int, int], int] = {}
    last_node: dict[int, int] = {}  # per thread, the seq of the last backward node that ran
    derived: dict[tuple[int, int], tuple[int, ForwardOrigin]] = {}
    for row in rows:
        stack = stacks.setdefault(row.thread, [])
        while stack and stack[-1].end < row.start:
            stack.pop()
        if row.name.startswith(BACKWARD_PREFIX) and row.name.endswith(ACCUMULATE_GRAD):
            # A parameter's AccumulateGrad carries no number: it runs right after the node that produced the
            # gradient (the engine ranks it first), whose forward op owns the parameter.
            if row.thread in last_node:
                nodes[(row.thread, row.start)] = last_node[row.thread]
        elif row.seq is not None:
            parent = stack[-1] if stack else None
            if parent is not None and parent.name.startswith(BACKWARD_PREFIX) and row.kind != "module":
                nodes.setdefault((row.thread, parent.start), row.seq)
                last_node[row.thread] = row.seq
            elif row.kind in FORWARD_KINDS and not row.name.startswith(BACKWARD_PREFIX):
                marker = next((r for r in reversed(stack) if r.name.startswith(BACKWARD_PREFIX)), None)
                inside = stack if marker is None else stack[stack.index(marker) + 1:]
                origin = ForwardOrigin(next((r.name for r in inside if r.kind == "op"), row.name),
                                       next((r.name for r in reversed(inside) if r.kind == "module"), None),
                                       next((r.name for r in reversed(inside) if r.kind == "site"), None),
                                       creator=row.name)
                if marker is None:
                    found[(row.thread, row.seq)] = origin
                elif (row.thread, marker.start) in nodes:
                    derived[(row.thread, row.seq)] = (nodes[(row.thread, marker.start)],
                                                      origin._replace(inside=marker.name[len(BACKWARD_PREFIX):]))
        stack.append(row)
    return SequenceIndex(found, nodes, derived)


def lookup(origins: dict[tuple[int, int], T], seq: int, threads: list[int]) -> T | None:
    """The origin of `seq`, searched on `threads` in order (the forward thread first: sequence numbers are per
    thread, and a backward range does not say which thread's number it carries)."""
    for thread in threads:
        origin = origins.get((thread, seq))
        if origin is not None:
            return origin
    return None
