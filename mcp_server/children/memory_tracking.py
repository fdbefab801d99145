"""What the memory pass records beside the allocator's history (standard library and torch only): every operator
call with its module, phase, call site and outputs, the phases' spans, and which tensors are parameters, buffers,
gradients, optimizer state and inputs.

Times are `time.time_ns()`: CLOCK_REALTIME, the clock the caching allocator converts its trace entries' `time_us`
to (c10's ApproximateClockToUnixTimeConverter), so the engine joins each allocation to the operator call, module
and phase that were running when it was made. Nothing here holds a tensor: every record is numbers and names.
"""

from __future__ import annotations

import bisect
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from mcp_server.children.common import tensors
from mcp_server.children.sites import UserFrames

FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
MAX_OUTPUTS = 8  # outputs of one operator call whose storages are recorded
MAX_INPUTS = 4  # inputs of a call outside every module whose storages are recorded


class Strings:
    """A table of the names the records refer to by number (operators, modules, call sites, dtypes)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}

    def id(self, name: str | None) -> int:
        """The number of `name` (-1 for None)."""
        if name is None:
            return -1
        found = self._index.get(name)
        if found is None:
            found = self._index[name] = len(self.names)
            self.names.append(name)
        return found


def storage_of(t: Any) -> tuple[int, int] | None:
    """(address, bytes) of a tensor's storage: the caching allocator's block address, or None (no storage)."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # a sparse or meta tensor, a tensor subclass without storage
        return None


class Spans:
    """Intervals [start_ns, end_ns] of one kind of work (backward, optimizer step, window iteration)."""

    def __init__(self) -> None:
        self.spans: list[list[int]] = []
        self._open: dict[int, int] = {}

    def begin(self) -> None:
        self._open[threading.get_ident()] = time.time_ns()

    def end(self) -> None:
        start = self._open.pop(threading.get_ident(), None)
        if start is not None:
            self.spans.append([start, time.time_ns()])

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, recording each call as a span."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.begin()
            try:
                return fn(*args, **kwargs)
            finally:
                self.end()

        wrapped.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapped


class ModuleStack:
    """Which module is running: global forward hooks name each call by its path in the model (a module outside it by
    its class). Backward work is the module's whose forward created its autograd node: each forward call spans the
    sequence numbers autograd gave the nodes created inside it, and a backward node's number falls in its module's
    innermost span; a parameter's gradient accumulation is its module's. Nothing is attached to the autograd graph,
    so no tensor lives longer than it would."""

    def __init__(self, model: Any, root: str) -> None:
        import torch

        self.root = root
        self.paths = {id(m): path or root for path, m in model.named_modules()}
        self.owners = {id(p): path or root for path, m in model.named_modules() for p in m.parameters(recurse=False)}
        self.stack: list[tuple[str, int]] = []  # (module, sequence number at its forward's start)
        # each finished forward call as (its first sequence number, minus its end, module): sorted, a call's
        # submodules come after it
        self.spans: list[tuple[int, int, str]] = []
        self._sequence_nr = getattr(torch._C._autograd, "_get_sequence_nr", None)
        self._handles: list[Any] = []

    def name(self, module: Any) -> str:
        return self.paths.get(id(module)) or type(module).__name__

    def current(self) -> str | None:
        """The innermost module whose forward is running."""
        return self.stack[-1][0] if self.stack else None

    def of_node(self, node: Any) -> str | None:
        """The module whose forward created autograd node `node` (a parameter's AccumulateGrad: its module)."""
        variable = getattr(node, "variable", None)
        if variable is not None:
            return self.owners.get(id(variable))
        number = node._sequence_nr()
        position = bisect.bisect_right(self.spans, (number, float("inf"), "")) - 1
        while position >= 0:  # spans nest: walking back, the first that holds the number is the innermost
            first, minus_end, name = self.spans[position]
            if first <= number < -minus_end:
                return name
            position -= 1
        return None

    def _pre(self, module: Any, args: Any) -> None:
        self.stack.append((self.name(module), self._sequence_nr() if self._sequence_nr else 0))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        name = self.name(module)
        for position in range(len(self.stack) - 1, -1, -1):
            if self.stack[position][0] == name:
                _, first = self.stack.pop(position)
                if self._sequence_nr is not None:
                    bisect.insort(self.spans, (first, -self._sequence_nr(), name))
                return

    def install(self) -> ModuleStack:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(self._pre),
                         register_module_forward_hook(self._post, always_call=True)]
        return self

    def reset(self) -> None:
        """Forget earlier iterations' forward calls (a new window begins)."""
        self.stack.clear()
        self.spans.clear()

    def remove(self) -> None:
        self.reset()
        for handle in self._handles:
            handle.remove()
        self._handles = []


def op_recorder(strings: Strings, modules: ModuleStack | None, optimizer: Spans, frames: UserFrames) -> Any:
    """A TorchDispatchMode recording every aten call as [op, start_ns, end_ns, thread, module, phase, call site,
    autograd node, [[storage address, bytes, dtype] of each output], [storage address of each input] (outside every
    module only)]. The mode sits below autograd, so it sees the backward pass's operators too (the engine's threads
    inherit it) and the operators that allocate."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    graph_task = torch._C._current_graph_task_id
    current_node = getattr(torch._C, "_current_autograd_node", None)
    phases = {FORWARD: strings.id(FORWARD), BACKWARD: strings.id(BACKWARD), OPTIMIZER: strings.id(OPTIMIZER)}

    class OpRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[list[Any]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace == "profiler":  # record_function's own markers: no work, no memory
                return func(*args, **(kwargs or {}))
            backward = graph_task() != -1
            phase = BACKWARD if backward else OPTIMIZER if optimizer._open else FORWARD
            node = module = None
            if backward and current_node is not None:
                found = current_node()
                node = found.name() if found is not None else None
                module = modules.of_node(found) if modules is not None and found is not None else None
            elif not backward and modules is not None:
                module = modules.current()
            site = None if backward else frames.site(sys._getframe(1))
            record: list[Any] = [strings.id(func._schema.name), time.time_ns(), 0, threading.get_ident(),
                                 strings.id(module), phases[phase], strings.id(site), strings.id(node), [], []]
            if module is None:  # outside every module (a loss): which tensors it reads, to follow them to theirs
                record[9] = [found[0] for t in tensors((args, kwargs))[:MAX_INPUTS]
                             if (found := storage_of(t)) is not None]
            self.calls.append(record)
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                record[2] = time.time_ns()
            outputs: list[list[int]] = record[8]
            for t in tensors(out)[:MAX_OUTPUTS]:
                found_storage = storage_of(t)
                if found_storage is not None:
                    outputs.append([*found_storage, strings.id(str(t.dtype).removeprefix("torch."))])
            return out

    return OpRecorder()


def alive_optimizers() -> Iterator[Any]:
    """Every torch.optim.Optimizer alive in this process (the workload's train_step holds its own)."""
    import torch

    for obj in gc.get_objects():
        if issubclass(type(obj), torch.optim.Optimizer):  # type(): a deprecated module proxy warns on __class__
            yield obj


def identities(model: Any, inputs: Any, root: str, strings: Strings, device_type: str = "cuda",
               optimizers: bool = True) -> list[list[int]]:
    """[storage address, bytes, category, module, name] of every parameter, buffer, gradient, optimizer state (all
    optimizers alive, unless `optimizers` is False) and input tensor on `device_type`: what the tensors alive now
    are, by the block that holds each."""
    import torch

    rows: list[list[int]] = []

    def add(t: Any, category: str, module: str | None, name: str) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == device_type:
            found = storage_of(t)
            if found is not None and found[0]:
                rows.append([*found, strings.id(category), strings.id(module), strings.id(name)])

    owners: dict[int, tuple[str, str]] = {}
    for path, module in model.named_modules():
        where = path or root
        for name, p in module.named_parameters(recurse=False):
            qualified = f"{path}.{name}" if path else name
            owners[id(p)] = (where, qualified)
            add(p, "parameter", where, qualified)
            if p.grad is not None:
                add(p.grad, "gradient", where, qualified + ".grad")
        for name, b in module.named_buffers(recurse=False):
            add(b, "buffer", where, f"{path}.{name}" if path else name)
    for optimizer in alive_optimizers() if optimizers else ():
        for param, state in list(optimizer.state.items()):
            where, name = owners.get(id(param), (None, "?"))
            for key, value in state.items():
                add(value, "optimizer_state", where, f"{name}.{key}")
    for position, t in enumerate(tensors(inputs)):
        add(t, "input_output", None, f"input[{position}]")
    return rows
