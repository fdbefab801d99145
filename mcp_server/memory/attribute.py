"""Attribution of every block: the operator call, module and phase that allocated it, its call site and what it
holds (MemoryCategory).

An allocation is joined to the operator call running when it was made (the harness's records and the allocator's
trace share one clock, CLOCK_REALTIME); the call gives the module, phase and dtype. Its call site is the innermost
frame of the user's code in the allocation's Python stack (else the operator call's). What a block holds comes
first from identity (the storages of the parameters, buffers, gradients, optimizer state and inputs alive before
and after the window, the model's outputs), then from its life: made in a forward pass and freed after it, an
activation saved for backward; made and freed within one library call, or kept by a GEMM, its workspace; made and
freed within a phase, a temporary; alive on either side of the window and unknown, retained. A call outside every
module (a loss on the model's output) takes the module of the tensors it reads (the storages' makers, in time).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mcp_server.memory.replay import Block
from mcp_server.schema.memory import MemoryCategory, MemoryRecord
from mcp_server.schema.profile import Phase

TOLERANCE_NS = 1_000  # the allocator's times are whole microseconds
LONG_NS = 1_000_000  # calls longer than this (a host-device sync) are few: every search checks them
# Operators that own library workspaces (cuBLAS, cuBLASLt, cuDNN, attention kernels, cuFFT).
LIBRARY_OPS = re.compile(r"mm|matmul|linear|conv|cudnn|miopen|attention|rnn|lstm|gru|_fft")
IDENTITY_RANK: dict[str, int] = {"parameter": 0, "buffer": 1, "gradient": 2, "optimizer_state": 3, "input_output": 4}
LIBRARY_PATHS = ("/site-packages/", "/dist-packages/", "/torchinductor_", "/mcp_server/children/")
PHASES: tuple[Phase, ...] = ("forward", "backward", "optimizer")


@dataclass(frozen=True, slots=True)
class Op:
    """One operator call of the harness's record."""

    name: str
    start_ns: int
    end_ns: int
    module: str | None
    phase: Phase | None
    call_site: str | None
    node: str | None
    outputs: dict[int, str | None]  # storage address -> dtype
    inherited: bool = False  # outside every module: the module is that of the tensors it read

    @property
    def label(self) -> str:
        """The operator's name, with the autograd node it ran for in backward."""
        return f"{self.name} ({self.node})" if self.node else self.name


@dataclass(slots=True)
class Attributed:
    """A block with what it holds and who made it."""

    block: Block
    category: MemoryCategory
    module: str | None
    operator: str | None
    call_site: str | None
    phase: Phase | None
    dtype: str | None = None
    name: str | None = None
    inherited: bool = False  # made outside every module: the module is that of the tensors its call read


def _phase(name: str | None) -> Phase | None:
    return next((p for p in PHASES if p == name), None)


class Ops:
    """The record's operator calls, searchable by time."""

    def __init__(self, record: MemoryRecord) -> None:
        name = record.name
        # which module made each storage: the model's tensors, then every call's outputs as time goes on
        made = {address: module for address, _, _, module_id, _ in (*record.identities_start, *record.identities_end)
                if (module := name(module_id)) is not None}
        self.ops = []
        for o in sorted(record.ops, key=lambda op: op[1]):
            module, phase = name(o[4]), _phase(name(o[5]))
            inherited = module is None and phase in ("forward", "backward")
            if inherited:  # a loss: the module whose output it reads
                module = next((made[a] for a in o[9] if a in made), None)
            op = Op(name(o[0]) or "?", o[1], o[2] or o[1], module, phase, name(o[6]), name(o[7]),
                    {out[0]: name(out[2]) for out in o[8]}, inherited and module is not None)
            for address in op.outputs:
                if module is not None:
                    made[address] = module
            self.ops.append(op)
        short = [op for op in self.ops if op.end_ns - op.start_ns <= LONG_NS]
        self.long = [op for op in self.ops if op.end_ns - op.start_ns > LONG_NS]  # few: searched one by one
        self.short, self.starts = short, [op.start_ns for op in short]

    def at(self, at_us: int) -> Op | None:
        """The operator call running during microsecond `at_us`: the one overlapping it most, the latest of equals."""
        low, high = at_us * 1000 - TOLERANCE_NS, at_us * 1000 + 999 + TOLERANCE_NS
        position = bisect.bisect_right(self.starts, high)
        candidates = list(self.long)
        while position > 0 and self.starts[position - 1] >= low - LONG_NS:
            position -= 1
            candidates.append(self.short[position])
        best: tuple[int, int, Op] | None = None
        for op in candidates:
            overlap = min(op.end_ns, high) - max(op.start_ns, low)
            if overlap >= 0 and (best is None or (overlap, op.start_ns) > best[:2]):
                best = (overlap, op.start_ns, op)
        return best[2] if best is not None else None


class Phases:
    """Which phase a time falls in: an optimizer step, a backward pass, or else the forward part of an iteration."""

    def __init__(self, record: MemoryRecord) -> None:
        self.optimizer, self.backward, self.iterations = record.optimizer, record.backward, record.iterations

    def at(self, at_ns: int) -> Phase | None:
        """The phase at `at_ns`; None outside every iteration and phase span."""
        for spans, phase in ((self.optimizer, "optimizer"), (self.backward, "backward")):
            if any(s - TOLERANCE_NS <= at_ns <= e + TOLERANCE_NS for s, e in spans):
                return phase  # type: ignore[return-value]
        if any(s <= at_ns <= e for s, e in self.iterations):
            return "forward"
        return None

    def backward_after(self, at_ns: int) -> int | None:
        """The start of the first backward pass that begins after `at_ns`."""
        return min((s for s, _ in self.backward if s >= at_ns), default=None)


def is_library(filename: str, roots: Sequence[str]) -> bool:
    """Whether a frame's file is torch's, the standard library's, an installed package's or generated code."""
    return (not filename or filename.startswith("<") or any(filename.startswith(r) for r in roots)
            or any(part in filename for part in LIBRARY_PATHS))


def user_frames(frames: list[dict[str, Any]], roots: Sequence[str]) -> list[dict[str, Any]]:
    """The frames of the user's code in a Python stack, innermost first."""
    return [f for f in frames if not is_library(str(f.get("filename", "")), roots)]


def site(frame: dict[str, Any]) -> str:
    """`file:line` of a frame."""
    return f"{frame.get('filename')}:{frame.get('line')}"


def identity_map(rows: list[tuple[int, int, int, int, int]], record: MemoryRecord) -> dict[int, tuple[str, str | None,
                                                                                                        str | None]]:
    """Storage address -> (category, module, name); where storages share a block the model's own tensor wins."""
    found: dict[int, tuple[str, str | None, str | None]] = {}
    for address, _, category, module, name in rows:
        kind = record.name(category) or "retained"
        current = found.get(address)
        if current is None or IDENTITY_RANK.get(kind, 9) < IDENTITY_RANK.get(current[0], 9):
            found[address] = (kind, record.name(module), record.name(name))
    return found


def attribute(blocks: list[Block], record: MemoryRecord, end_ns: int | None) -> list[Attributed]:
    """Every block attributed; `end_ns` ends the window (None: the trace's end, at a failure)."""
    ops, phases = Ops(record), Phases(record)
    roots = record.library_roots
    before, after = identity_map(record.identities_start, record), identity_map(record.identities_end, record)
    outputs = [(address, at) for address, _, at in record.outputs]
    gradients: dict[int, list[tuple[int, str | None, str | None]]] = {}
    for address, _, module_id, name_id, at in record.gradients:
        gradients.setdefault(address, []).append((at, record.name(module_id), record.name(name_id)))
    compiled = record.compile_mode not in (None, "eager")
    training = record.run_mode == "train_step"
    found = []
    for block in blocks:
        frames = user_frames(block.frames, roots)
        call_site = site(frames[0]) if frames else None
        alive_at_end = block.free_us is None or (end_ns is not None and block.free_us * 1000 > end_ns)
        if block.alloc_us is None:  # held before the trace began
            known = before.get(block.address) or (after.get(block.address) if alive_at_end else None)
            category, module, name = known or ("retained", None, None)
            found.append(Attributed(block, category, module, None, call_site, None, name=name))  # type: ignore[arg-type]
            continue
        op = ops.at(block.alloc_us)
        phase = op.phase if op is not None and op.phase is not None else phases.at(block.alloc_us * 1000)
        module = op.module if op is not None else None
        if module is None and phase is not None and (compiled or phase == "optimizer"):
            module = record.root_module  # a compiled graph, or the optimizer's step: the model as a whole
        entry = Attributed(block, "temporary", module, op.label if op is not None else None,
                           call_site or (op.call_site if op is not None else None), phase,
                           op.outputs.get(block.address) if op is not None else None,
                           inherited=op is not None and op.inherited)
        known = after.get(block.address) if alive_at_end else None
        held = _alive_at(block, gradients.get(block.address, []))
        if known is None and held is not None:  # a gradient an optimizer step saw, freed before the window ended
            known = ("gradient", held[1], held[2])
        if known is not None:
            entry.category, entry.name = known[0], known[2]  # type: ignore[assignment]
            entry.module = known[1] or entry.module
        elif any(address == block.address and block.alloc_us * 1000 - TOLERANCE_NS <= at
                 and (block.free_us is None or at <= block.free_us * 1000 + 999 + TOLERANCE_NS)
                 for address, at in outputs):
            entry.category, entry.module = "input_output", entry.module or record.root_module
        else:
            entry.category = _by_life(block, op, phases, phase, training, alive_at_end, end_ns is None)
        found.append(entry)
    return found


def _alive_at(block: Block, seen: list[tuple[int, str | None, str | None]]) -> tuple[int, str | None,
                                                                                   str | None] | None:
    """The first sighting (time_ns, module, name) that falls while `block` was allocated, if any."""
    for sighting in seen:
        at = sighting[0]
        if block.alloc_us is not None and block.alloc_us * 1000 - TOLERANCE_NS <= at and (
                block.free_us is None or at <= block.free_us * 1000 + 999 + TOLERANCE_NS):
            return sighting
    return None


def _by_life(block: Block, op: Op | None, phases: Phases, phase: Phase | None, training: bool,
             alive_at_end: bool, failure: bool) -> MemoryCategory:
    """What a block no identity names holds, from the call that made it and when it was freed (at a `failure`,
    what is still allocated is held by the work in flight, not across steps)."""
    own_output = op is not None and block.address in op.outputs
    if op is not None and not own_output:
        inside = block.free_us is not None and block.free_us * 1000 <= op.end_ns + TOLERANCE_NS
        if inside or LIBRARY_OPS.search(op.name):
            return "workspace" if LIBRARY_OPS.search(op.name) else "temporary"
    if alive_at_end and not failure:
        return "retained"
    if training and phase == "forward" and block.alloc_us is not None:
        backward = phases.backward_after(block.alloc_us * 1000)
        if (block.free_us is None and failure) or (
                backward is not None and (block.free_us is None or block.free_us * 1000 > backward)):
            return "activation"
    return "temporary"
