"""Which phase of a training step each piece of work belongs to, and what backward work differentiates.

A stack inside one of torch.optim's own ranges (`Optimizer.step#AdamW.step`, `Optimizer.zero_grad#...`), or the
harness's range around a hand-written loop's update (a script windowed by its backward() calls), is the optimizer's; one
inside the autograd engine's marker (`autograd::engine::evaluate_function: <node>`) is backward work, tied through its
node's sequence number to the forward op, module and call site it differentiates; every other stack is forward work.
A closure the optimizer's step calls (`LBFGS.step(closure)`) keeps its forward and backward phases inside the step.
In a training step, work outside the model between a backward and the step that follows it (gradient clipping, a
GradScaler's unscale), and after the window's last backward (an average of the weights), is the update's, as the
optimizer's step is (`update_after_backward`), and so is a multi-tensor (`_foreach_*`) operator outside the model
wherever it runs (an EMA at the window's start), and a GradScaler's update of its scale (`foreach_updates`).
The seed gradient a backward starts from (`torch.ones_like(loss)`, made before autograd's engine runs) is backward
work too (`backward_seeds`). A module's forward called inside the engine's marker is forward work run again by
activation checkpointing (`torch.utils.checkpoint`): recomputed, in the backward phase, with its own module and, once
the window's operators are known, the call site of the same call in the forward (`recomputed_call_sites`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from mcp_server.assemble.collectives import distributed_operator, kernel_collective
from mcp_server.children.contract import CLOSURE_RANGE, STEP_OF_PREFIX
from mcp_server.schema.profile import OperatorRecord, Phase, RuntimeEvent
from plugins.ncu import keys
from plugins.nvtx_names import OPTIMIZER_PREFIXES, STEP_PREFIX
from plugins.sequences import BACKWARD_PREFIX, ForwardOrigin, SequenceIndex, lookup

# autograd's node for an in-place op on a view, numbered when made, right after the op's own node
# (torch/csrc/autograd/functions/tensor.cpp: `CopySlices` is built as a `Node()`, which takes the next number)
COPY_SLICES = "CopySlices"
MAX_DERIVATIVE_ORDER = 8  # nodes of backwards of backwards followed back to a forward call


class FrameLike(keys.FrameLike, Protocol):
    """What attribution reads of an enclosing range: `Frame`, or the nsys reader's light `NvtxRange`."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str | None: ...  # a light range is classified once it encloses a launch
    @property
    def start_ns(self) -> int | None: ...
    @property
    def input_dtypes(self) -> list[str | None] | None: ...
    @property
    def seq(self) -> int | None: ...


def _module_path(stack: Sequence[FrameLike]) -> str | None:
    modules = [f.name for f in stack if f.kind == "module"]
    return modules[-1] if modules else None


class Context:
    """What attribution knows beyond each kernel's stack: forward ops by sequence number (to tie backward work to
    them), the threads whose numbers count first, and the module path naming the model itself."""

    def __init__(self, sequences: SequenceIndex | None = None, forward_threads: list[int] | None = None,
                 root_module: str | None = None) -> None:
        self.origins = sequences.origins if sequences else {}
        self.nodes = sequences.nodes if sequences else {}
        self.derived = sequences.derived if sequences else {}
        self.threads = list(forward_threads or [])
        self.measure_threads = frozenset(self.threads)
        self.threads += sorted({t for t, _ in [*self.origins, *self.derived]} - set(self.threads))
        self.root_module = root_module

    def records_operators(self, thread: int | None, backward: bool) -> bool:
        """Whether operator ranges are recorded where a kernel was launched: on the measure range's threads (all
        of them when the capture does not say which) and in autograd's backward nodes; not on a thread of the
        workload's own, where a launch outside every operator range is an operator's that nothing names."""
        return backward or not self.measure_threads or thread in self.measure_threads

    def forward(self, marker: FrameLike, node: FrameLike | None, thread: int | None) -> ForwardOrigin | None:
        """The forward op a backward node differentiates: by the node range's seq, the marker's own (Kineto's
        carries it), or its marker's start. A
        `CopySlices` node (an in-place write into a view: `out[:, :4] = x`) takes the number after the in-place
        op's own, which no forward op started with: it differentiates that op."""
        seq = node.seq if node is not None else marker.seq
        if seq is None and thread is not None and marker.start_ns is not None:
            seq = self.nodes.get((thread, marker.start_ns))
        if seq is None or not self.origins:
            return None
        if marker.name.endswith(COPY_SLICES) and (written := lookup(self.origins, seq - 1, self.threads)):
            return written
        return (self._made(seq, marker.name.removeprefix(BACKWARD_PREFIX)) or lookup(self.origins, seq, self.threads)
                or self._derived(seq))

    def _made(self, seq: int, node: str, depth: int = 0) -> ForwardOrigin | None:
        """Of the calls that took `seq` on any thread (numbers are per thread: a backward that builds a graph on
        autograd's device thread numbers its nodes there), the one whose operator makes a node of that name
        (`aten::mm` makes `MmBackward0`, `aten::tanh_backward` `TanhBackwardBackward0`); None when no name tells."""
        made = _node_operator(node)
        for thread in self.threads:
            origin = self.origins.get((thread, seq))
            if origin is not None and _operator_key(origin.creator) == made:
                return origin
            derived = self.derived.get((thread, seq))
            if derived is not None and _operator_key(derived[1].creator) == made:
                return self._derived(seq, depth, thread=thread)
        return None

    def _derived(self, seq: int, depth: int = 0, thread: int | None = None) -> ForwardOrigin | None:
        """The origin of a node of a second backward: the operator a first backward's node ran with
        `create_graph=True`, in the module and at the call site of that node's forward call. That node may be a
        second backward's itself (a second derivative taken with `create_graph=True`: `u_xx` of a
        physics-informed loss), and so on."""
        found = (None if depth >= MAX_DERIVATIVE_ORDER else self.derived.get((thread, seq)) if thread is not None
                 else lookup(self.derived, seq, self.threads))
        if found is None:
            return None
        node_seq, origin = found
        if origin.module_path is not None:  # a module's forward, run again by the node: its call site comes later
            return origin._replace(recomputed=True)
        first = ((self._made(node_seq, origin.inside, depth + 1) if origin.inside else None)
                 or lookup(self.origins, node_seq, self.threads) or self._derived(node_seq, depth + 1))
        if first is None:
            return origin
        return ForwardOrigin(origin.op, first.module_path, origin.call_site or first.call_site)


def _node_operator(node: str) -> str:
    """The operator an autograd node's name says made it, as `_operator_key` spells it: `MmBackward0` -> "mm",
    `TanhBackwardBackward0` -> "tanhbackward", `NativeLayerNormBackward0` -> "nativelayernorm"."""
    return re.sub(r"Backward\d*$", "", node).lower()


def _operator_key(name: str | None) -> str | None:
    """An operator's name without its namespace and underscores, lower case: `aten::tanh_backward` ->
    "tanhbackward"."""
    return None if name is None else name.rsplit("::", 1)[-1].replace("_", "").lower()


def _phase(stack: Sequence[FrameLike]) -> tuple[Phase, FrameLike | None, FrameLike | None]:
    """(phase, the backward marker, the autograd node's own range) of a stack. Inside torch.optim's step, the
    closure it calls (`LBFGS.step(closure)` runs the forward and the backward itself) keeps its own phases: a
    backward node is backward work, and the rest of the closure (a script's harness ranges it: `CLOSURE_RANGE`)
    forward work; where nothing ranged it, a module's call or an operator recorded with grad mode on (it carries a
    sequence number; the optimizer's own math runs under `no_grad`) is."""
    phase: Phase = "forward"
    marker = node = None
    stepping = False
    for position, frame in enumerate(stack):
        name = frame.name
        if stepping and not name.startswith(BACKWARD_PREFIX):
            if name == CLOSURE_RANGE or frame.kind == "module" or (frame.kind == "op" and frame.seq is not None):
                stepping, phase = False, "forward"
            continue
        if name.startswith(OPTIMIZER_PREFIXES):
            if not name.startswith(STEP_PREFIX):
                return "optimizer", None, None
            stepping, phase = True, "optimizer"
            continue
        if name.startswith(BACKWARD_PREFIX):
            stepping = False
            phase, marker = "backward", frame
            following = stack[position + 1] if position + 1 < len(stack) else None
            # the node's own range (`AddmmBackward0, seq = N`); not an operator the engine ran in the marker after
            # the node returned, which carries a number of its own when the backward builds a graph
            node = following if following is not None and following.seq is not None and following.kind != "op" \
                else None
    return phase, marker, node


class Work(NamedTuple):
    """What a stack says about the work under it beyond its operator: phase, call site, backward origin."""

    phase: Phase
    module_path: str | None
    call_site: str | None
    autograd_node: str | None
    forward_op: str | None
    recomputed: bool = False


def work_of(stack: Sequence[FrameLike], context: Context, thread: int | None) -> Work:
    """The phase of the work under `stack`, its module path and call site (a backward node's from the forward op
    it differentiates, unless the workload's own code ran inside the node; the optimizer's module is the one holding
    the parameters it updates, else the model itself) and, for backward work, node and forward op.
    Forward work a backward node runs again (a module called inside it: checkpointing) is `recomputed`: its call
    site is a site range inside the node's when there is one, else left for `recomputed_call_sites`."""
    phase, marker, node = _phase(stack)
    module_path = _module_path(stack)
    call_site = next((f.name for f in reversed(stack) if f.kind == "site"), None)
    autograd_node = forward_op = None
    inner = _inside(stack, marker) if marker is not None else ()
    # the workload's own code run inside a backward node (a custom backward, a gradient hook) is at its own line
    own_site = next((f.name for f in reversed(inner) if f.kind == "site"), None)
    if _recomputes(inner):
        return Work(phase, module_path, own_site, None, None, recomputed=True)
    if marker is not None:
        autograd_node = marker.name.removeprefix(BACKWARD_PREFIX)
        origin = context.forward(marker, node, thread)
        if origin is not None:
            forward_op = origin.op
            module_path = module_path or origin.module_path
            # a recomputed call's site is known once the window's calls are (`recomputed_backward_sites`); distributed
            # training's own work run from a hook inside the node (DDP's all-reduce of the bucket the node finished)
            # is the backward call's, not the forward call's (`backward_call_sites`)
            call_site = own_site or (None if _distributed(inner) else origin.call_site) or (
                None if origin.recomputed else call_site)
    if phase == "optimizer" and module_path is None:
        module_path = _stepped_model(stack) or context.root_module
    return Work(phase, module_path, call_site, autograd_node, forward_op)


def _stepped_model(stack: Sequence[FrameLike]) -> str | None:
    """The module holding the parameters the optimizer step around this work updates (a script's `STEP_OF_PREFIX`
    range)."""
    return next((f.name[len(STEP_OF_PREFIX):] for f in reversed(stack) if f.name.startswith(STEP_OF_PREFIX)), None)


def _recomputes(inner: Sequence[FrameLike]) -> bool:
    """Whether the frames inside a backward node's range are forward work run again: a module's forward called
    there. FSDP2's unit ranges read as modules too (`FSDP::all_gather (layers.3)`); the work under them is its own
    collectives and copies, not a forward."""
    return any(f.kind == "module" for f in inner) and not _distributed(inner)


def _distributed(inner: Sequence[FrameLike]) -> bool:
    """Whether the outermost operator inside a backward node's range is distributed training's own."""
    outer_op = next((f for f in inner if f.kind == "op"), None)
    return outer_op is not None and distributed_operator(outer_op.name)


def _inside(stack: Sequence[FrameLike], marker: FrameLike) -> Sequence[FrameLike]:
    """The frames of `stack` inside `marker`'s."""
    for position, frame in enumerate(stack):
        if frame is marker:
            return stack[position + 1:]
    return ()


def settle_phases(operators: Sequence[OperatorRecord], events: Sequence[RuntimeEvent] = ()) -> None:
    """What the window's order says once every call is attributed (window order): recomputed calls take their
    forward call's site (`recomputed_call_sites`), the backward through them their site (`recomputed_backward_sites`),
    and so do the events they made; each backward's seed gradient is
    the backward's (`backward_seeds`), and backward work that differentiates no forward call takes its line
    (`backward_call_sites`); work between a backward and its step is the update's (`update_after_backward`),
    and so is a multi-tensor operator, or a scaler's update, outside the model anywhere in a training window
    (`foreach_updates`)."""
    recomputed_call_sites(operators)
    recomputed_backward_sites(operators)
    sites = {op.operator_id: op.call_site for op in operators if op.recomputed or op.phase == "backward"}
    for event in events:
        if event.call_site is None and event.operator_id in sites:
            event.call_site = sites[event.operator_id]
    backward_seeds(operators, events)
    backward_call_sites(operators, events)
    update_after_backward(operators, events)
    foreach_updates(operators, events)


SEED_OPERATOR = "aten::ones_like"  # autograd's seed gradient of a scalar output (`_make_grads`)


def backward_seeds(operators: Sequence[OperatorRecord], events: Sequence[RuntimeEvent] = ()) -> None:
    """The seed gradient `loss.backward()` (or `torch.func.grad`) makes of a scalar loss, `torch.ones_like(loss)`
    outside the model right before the backward runs, is the backward's work, not the forward's."""
    seeds = [op for op, following in zip(operators, operators[1:], strict=False)
             if op.operator_name == SEED_OPERATOR and op.phase == "forward" and op.module_path is None
             and following.phase == "backward"]
    _move(seeds, "backward", events)


def backward_call_sites(operators: Sequence[OperatorRecord], events: Sequence[RuntimeEvent] = ()) -> None:
    """Backward work without a line that differentiates no forward call, or is distributed training's own (DDP's
    reducer: its all-reduce of a bucket and the division of the gradients, launched from C++ hooks inside whatever
    node finished the bucket, a compiled graph's included), was caused by the backward call: it takes the line of
    the seed gradient before it (`loss.backward()`), as do the events it made."""
    site = None
    given: dict[str, str] = {}
    for op in operators:
        if op.phase != "backward":
            continue
        if op.operator_name == SEED_OPERATOR and op.module_path is None:
            site = op.call_site
        elif op.call_site is None and site is not None and (
                op.forward_op is None or distributed_operator(op.operator_name)):
            op.call_site = given[op.operator_id] = site
    for event in events:
        if event.call_site is None and event.operator_id in given:
            event.call_site = given[event.operator_id]


# multi-tensor ops: updates of many tensors at once; and a GradScaler's update of its scale (`scaler.update()`)
FOREACH_PREFIXES = ("aten::_foreach_", "aten::_amp_foreach_", "aten::_amp_update_scale_")


def foreach_updates(operators: Sequence[OperatorRecord], events: Sequence[RuntimeEvent] = ()) -> None:
    """In a training window, a multi-tensor (`_foreach_*`) operator outside the model is an update of the weights
    wherever it runs: an average of the weights after the previous step's `optimizer.step()` (an EMA) runs at the
    window's start, before any backward. So is a GradScaler's update of its scale, after a step that is not the
    window's last."""
    if not any(op.phase == "backward" for op in operators):
        return
    _move([op for op in operators if op.phase == "forward" and op.module_path is None
           and op.operator_name.startswith(FOREACH_PREFIXES)], "optimizer", events)


def _move(operators: Sequence[OperatorRecord], phase: Phase, events: Sequence[RuntimeEvent]) -> None:
    """Put `operators`, their kernels and the events they made in `phase`."""
    moved = {op.operator_id for op in operators}
    for op in operators:
        op.phase = phase
        for kernel in op.kernels:
            kernel.phase = phase
    for event in events:
        if event.operator_id in moved:
            event.phase = phase


def update_after_backward(operators: Sequence[OperatorRecord], events: Sequence[RuntimeEvent] = ()) -> None:
    """In a window with backward and optimizer work, the calls outside any module between a backward and the
    optimizer's step that follows it before the model runs again are the update's, not the forward's: phase
    optimizer, on them, their kernels and the events they made (gradient clipping, a GradScaler's unscale), in every
    step of the window. After the window's last backward every such call is (an EMA of the weights after the step,
    the scaler's update). Calls between a backward and the model's next forward with no step between (the next
    micro-batch's loading, under gradient accumulation) stay the forward's. Distributed training's own calls before
    the optimizer's step (a collective, FSDP's packing of the gradients it reduces: the backward's final callbacks
    run them) are the backward's."""
    last = max((i for i, op in enumerate(operators) if op.phase == "backward"), default=None)
    if last is None or not any(op.phase == "optimizer" for op in operators):
        return
    update: list[OperatorRecord] = []
    callbacks: list[OperatorRecord] = []  # distributed training's, before the step
    # outside the model since a backward; None once a step or the model ran after it (a zero_grad() before the
    # next batch's loading ends nothing then)
    span: list[OperatorRecord] | None = None
    for op in operators[:last]:
        if op.phase == "backward":
            span = []
        elif span is None:
            continue
        elif op.phase == "optimizer":
            _split(span, update, callbacks)
            span = None
        elif op.module_path is not None:
            span = None
        else:
            span.append(op)
    stepped = False
    for op in operators[last + 1:]:
        stepped = stepped or op.phase == "optimizer"
        if op.phase == "forward" and op.module_path is None:
            if not _communicates(op):
                update.append(op)
            elif not stepped:
                callbacks.append(op)
    _move(update, "optimizer", events)
    _move(callbacks, "backward", events)


def _split(span: Sequence[OperatorRecord], update: list[OperatorRecord], callbacks: list[OperatorRecord]) -> None:
    """The calls outside the model between a backward and its step: distributed training's to `callbacks`, the
    rest to `update`."""
    for op in span:
        (callbacks if _communicates(op) else update).append(op)


def _communicates(op: OperatorRecord) -> bool:
    """A call of distributed training's own: a collective, or torch.distributed's and FSDP's operators."""
    return distributed_operator(op.operator_name) or any(kernel_collective(k.kernel_name) for k in op.kernels)


def recomputed_call_sites(operators: Sequence[OperatorRecord]) -> None:
    """Give each recomputed call without a call site the call site of the same call in the forward: the n-th
    recomputed call of an operator in a module takes the n-th forward call's (repeating: a module checkpointed and
    called several times is recomputed as often), in window order."""
    forward: dict[tuple[str | None, str], list[str | None]] = {}
    for op in operators:
        if op.phase == "forward" and not op.recomputed:
            forward.setdefault((op.module_path, op.operator_name), []).append(op.call_site)
    seen: dict[tuple[str | None, str], int] = {}
    for op in operators:
        if op.recomputed and op.call_site is None:
            key = (op.module_path, op.operator_name)
            number = seen.get(key, 0)
            seen[key] = number + 1
            if sites := forward.get(key):
                op.call_site = sites[number % len(sites)]


def recomputed_backward_sites(operators: Sequence[OperatorRecord]) -> None:
    """Give each backward call without a call site that differentiates a recomputed call (reentrant checkpointing:
    the node runs the module's forward again, then a backward through it) the site of the last recomputed call of
    its module and forward operator before it, in window order, else of its module's."""
    last: dict[tuple[str | None, str | None], str | None] = {}
    for op in operators:
        if op.recomputed and op.call_site is not None:
            last[(op.module_path, op.operator_name)] = last[(op.module_path, None)] = op.call_site
        elif op.phase == "backward" and op.call_site is None and op.module_path is not None:
            op.call_site = last.get((op.module_path, op.forward_op)) or last.get((op.module_path, None))
