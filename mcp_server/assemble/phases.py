"""Which phase of a training step each piece of work belongs to, and what backward work differentiates.

A stack inside one of torch.optim's own ranges (`Optimizer.step#AdamW.step`, `Optimizer.zero_grad#...`), or the
harness's range around a hand-written loop's update (a script windowed by its backward() calls), is the optimizer's; one
inside the autograd engine's marker (`autograd::engine::evaluate_function: <node>`) is backward work, tied through its
node's sequence number to the forward op, module and call site it differentiates; every other stack is forward work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from mcp_server.children.contract import UPDATE_RANGE
from mcp_server.schema.profile import Phase
from plugins.ncu import keys
from plugins.sequences import BACKWARD_PREFIX, ForwardOrigin, SequenceIndex, lookup

# torch.optim's own profiler ranges, and the harness's around a hand-written loop's update (`--window-fn backward`)
OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#", UPDATE_RANGE)


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
        self.threads = list(forward_threads or [])
        self.threads += sorted({t for t, _ in self.origins} - set(self.threads))
        self.root_module = root_module

    def forward(self, marker: FrameLike, node: FrameLike | None, thread: int | None) -> ForwardOrigin | None:
        """The forward op a backward node differentiates: by the node range's seq, or its marker's start."""
        seq = node.seq if node is not None else None
        if seq is None and thread is not None and marker.start_ns is not None:
            seq = self.nodes.get((thread, marker.start_ns))
        return lookup(self.origins, seq, self.threads) if seq is not None and self.origins else None


def _phase(stack: Sequence[FrameLike]) -> tuple[Phase, FrameLike | None, FrameLike | None]:
    """(phase, the backward marker, the autograd node's own range) of a stack."""
    phase: Phase = "forward"
    marker = node = None
    for position, frame in enumerate(stack):
        name = frame.name
        if name.startswith(OPTIMIZER_PREFIXES):
            return "optimizer", None, None
        if name.startswith(BACKWARD_PREFIX):
            phase, marker = "backward", frame
            following = stack[position + 1] if position + 1 < len(stack) else None
            node = following if following is not None and following.seq is not None else None
    return phase, marker, node


class Work(NamedTuple):
    """What a stack says about the work under it beyond its operator: phase, call site, backward origin."""

    phase: Phase
    module_path: str | None
    call_site: str | None
    autograd_node: str | None
    forward_op: str | None


def work_of(stack: Sequence[FrameLike], context: Context, thread: int | None) -> Work:
    """The phase of the work under `stack`, its module path and call site (a backward node's from the forward op
    it differentiates; the optimizer's module is the model itself) and, for backward work, node and forward op."""
    phase, marker, node = _phase(stack)
    module_path = _module_path(stack)
    call_site = next((f.name for f in reversed(stack) if f.kind == "site"), None)
    autograd_node = forward_op = None
    if marker is not None:
        autograd_node = marker.name.removeprefix(BACKWARD_PREFIX)
        origin = context.forward(marker, node, thread)
        if origin is not None:
            forward_op = origin.op
            module_path = module_path or origin.module_path
            call_site = origin.call_site or call_site
    if phase == "optimizer" and module_path is None:
        module_path = context.root_module
    return Work(phase, module_path, call_site, autograd_node, forward_op)
