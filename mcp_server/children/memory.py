"""The memory pass (standard library and torch only): the CUDA caching allocator's history over the measured window.

The harness runs the workload as in every pass; with `--profiler memory` it records, from before the model is built,
the allocator's history with Python stacks (`torch.cuda.memory._record_memory_history(stacks="python")`: no C++
frames, which cost seconds per snapshot). At the window it writes into the pass's folder:

- `snapshot_start.pickle`: `torch.cuda.memory._snapshot()` just before the window, the state the window starts from
  (parameters, gradients, optimizer state already resident; the history before it left out), after which the
  history is cleared;
- `snapshot.pickle`: the snapshot after the window, whose trace is the window's allocations and frees (open it in
  https://pytorch.org/memory_viz as it is);
- `memory_record.json`: what the harness saw meanwhile (`memory_tracking`): operator calls, modules, phases, which
  tensors are parameters, gradients, optimizer state and inputs, the allocator's own peaks.

When the workload runs out of memory (before or inside the window), an out-of-memory observer takes the snapshot
at the failure: the history from the last snapshot up to the failed request, with the observer's numbers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mcp_server.children.closures import around_closure
from mcp_server.children.common import ContractError, write_json
from mcp_server.children.contract import NO_CUDA
from mcp_server.children.memory_tracking import (
    ModuleStack,
    Spans,
    Strings,
    identities,
    op_recorder,
)
from mcp_server.children.sites import UserFrames

RECORD_VERSION = 1
MARKER_BYTES = 1_234_567  # a request size no tensor asks for: its trace entries tie the allocator's clock to ours
HISTORY_ENTRIES = 5_000_000  # the allocator's ring buffer of trace entries
START, END, RECORD = "snapshot_start.pickle", "snapshot.pickle", "memory_record.json"
STATS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
         "allocated_bytes.all.current", "reserved_bytes.all.current", "num_alloc_retries", "num_ooms")

_ACTIVE: MemoryCapture | None = None


class NoCuda(ContractError):
    """The memory pass records the CUDA caching allocator: the workload's torch sees no CUDA device."""

    kind = NO_CUDA


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is torch's out-of-memory error (CUDA's caching allocator or another device's)."""
    import torch

    kinds = tuple(k for k in (getattr(torch, "OutOfMemoryError", None),
                              getattr(torch.cuda, "OutOfMemoryError", None)) if isinstance(k, type))
    return isinstance(exc, kinds)


class MemoryCapture:
    """Records the allocator's history for the whole run and writes the window's (or the failure's) files."""

    def __init__(self, folder: Path, result: dict[str, Any]) -> None:
        self.folder, self.result = folder, result
        self.strings = Strings()
        self.record: dict[str, Any] = {"version": RECORD_VERSION, "clock": "time.time_ns", "window": None,
                                       "markers": [], "oom": None, "outputs": [], "gradients": []}
        self.backward, self.optimizer, self.iterations = Spans(), Spans(), Spans()
        self.modules: ModuleStack | None = None
        self.ops: Any = None
        self._restore: list[Callable[[], None]] = []
        self._oom_snapshot: Any = None
        self._start_snapshot: Any = None
        self._in_window = False
        self._model: Any = None
        self._inputs: Any = None
        self._root = "model"

    # ------------------------------------------------------------------------------------- the whole run

    def __enter__(self) -> MemoryCapture:
        import torch

        if not torch.cuda.is_available():
            raise NoCuda(f"the memory pass records the CUDA caching allocator, and torch {torch.__version__} under "
                         f"{sys.executable} sees no CUDA device")
        self.device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(self.device)
        self.record.update(device=self.device, device_name=props.name, total_memory=props.total_memory,
                           library_roots=list(UserFrames().roots))
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=HISTORY_ENTRIES)
        self._start_snapshot = torch.cuda.memory._snapshot()
        self.record["start_snapshot_ns"] = time.time_ns()
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(self._on_oom)
        self._phases(torch)
        return self

    def _phases(self, torch: Any) -> None:
        """Spans of the backward passes (torch.autograd.backward/grad) and optimizer steps (torch.optim's hooks)."""
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)
            setattr(torch.autograd, name, self.backward.wrap(original))
            self._restore.append(functools.partial(setattr, torch.autograd, name, original))
        pre = register_optimizer_step_pre_hook(self._step_begins)
        post = register_optimizer_step_post_hook(lambda *_: self.optimizer.end())
        self._restore += [pre.remove, post.remove]

    def _step_begins(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """An optimizer step begins: every gradient exists now (a step may free them after: set_to_none). The
        closure it may call (`LBFGS.step(closure)`: a forward and a backward) is left out of its span."""
        self.optimizer.begin()
        if self._model is not None:
            now = time.time_ns()
            for row in identities(self._model, (), self._root, self.strings, optimizers=False):
                if self.strings.names[row[2]] == "gradient":
                    self.record["gradients"].append([row[0], row[1], row[3], row[4], now])
        return around_closure(args, kwargs, self.optimizer.end, self.optimizer.begin)

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        """The allocator failed a request: its history up to now is what held the memory."""
        import torch

        if self._oom_snapshot is None:
            self.record["oom"] = {"stage": self.result.get("phase"), "requested": int(alloc),
                                  "device_total": int(device_allocated), "device_free": int(device_free),
                                  "time_ns": time.time_ns()}
            self._oom_snapshot = torch.cuda.memory._snapshot()

    def watch(self, model: Any, inputs: Any, root: str, compile_mode: str) -> None:
        """The model is built: in eager mode, record every operator call and module from now on."""
        self._model, self._inputs, self._root = model, inputs, root
        self.record.update(root_module=root, compile_mode=compile_mode)
        if compile_mode != "eager":  # hooks and a dispatch mode would change what Dynamo traces
            return
        self.modules = ModuleStack(model, root).install()
        self.ops = op_recorder(self.strings, self.modules, self.optimizer, UserFrames())
        self.ops.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        import torch

        if self.ops is not None:
            self.ops.__exit__(None, None, None)
        if self.modules is not None:
            self.modules.remove()
        for restore in reversed(self._restore):
            restore()
        if exc is not None and (self._oom_snapshot is not None or out_of_memory(exc)):
            snapshot = self._oom_snapshot if self._oom_snapshot is not None else torch.cuda.memory._snapshot()
            if self.record["oom"] is None:  # raised without reaching the allocator's observer
                self.record["oom"] = {"stage": self.result.get("phase"), "message": str(exc).splitlines()[0],
                                      "time_ns": time.time_ns()}
            if not self._in_window:  # the trace runs from the start of the history, not from the window's start
                self._write(START, self._start_snapshot)
            self._finish(torch, snapshot)
        with contextlib.suppress(RuntimeError):  # a CUDA error in the workload may have left no context to ask
            torch.cuda.memory._record_memory_history(enabled=None)

    # ------------------------------------------------------------------------------------- the window

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        """Around the measured window: the state before it, a history of it alone, the state after it."""
        import torch

        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:  # cuBLAS allocates its workspace again inside the window's first GEMM: it shows
            clear()
        self.record["cublas_workspaces_cleared"] = clear is not None
        t0 = time.perf_counter()
        if self._model is not None:
            self.record["identities_start"] = identities(self._model, self._inputs, self._root, self.strings)
        # the state before the window; its trace (the build's and the warm-up's history) is left out
        snapshot = torch.cuda.memory._snapshot()
        self.record["start_snapshot_ns"] = time.time_ns()
        self._start_snapshot = {**snapshot, "device_traces": [[] for _ in snapshot.get("device_traces", [])]}
        self._write(START, self._start_snapshot)
        self.record["history_cleared"] = _clear_history(torch)
        self.record["start_snapshot_s"] = round(time.perf_counter() - t0, 3)
        if self.ops is not None:
            self.ops.calls.clear()
        if self.modules is not None:
            self.modules.reset()
        for spans in (self.backward, self.optimizer, self.iterations):
            spans.spans.clear()
        self.record["gradients"].clear()
        self._forget_oom()  # one the workload caught and recovered from
        self._marker(torch)
        torch.cuda.reset_peak_memory_stats()
        # the model's outputs (eager: a hook registered on a compiled model would make Dynamo compile it again)
        eager = self.record.get("compile_mode") == "eager" and hasattr(self._model, "register_forward_hook")
        hook = self._model.register_forward_hook(self._output) if eager else None
        self._in_window = True
        start = time.time_ns()
        try:
            yield
            torch.cuda.synchronize()
        finally:
            self.record["window"] = [start, time.time_ns()]
            if hook is not None:
                hook.remove()
        self._in_window = False
        self._forget_oom()
        self._finish(torch, None)

    def _forget_oom(self) -> None:
        self._oom_snapshot = None
        self.record["oom"] = None

    def _output(self, module: Any, args: Any, output: Any) -> None:
        from mcp_server.children.memory_tracking import storage_of, tensors

        now = time.time_ns()
        for t in tensors(output):
            found = storage_of(t) if t.device.type == "cuda" else None
            if found is not None:
                self.record["outputs"].append([*found, now])

    def step(self, fn: Callable[[], None]) -> Callable[[], None]:
        """The window's iteration `fn` (the warm-up's too), each call recorded as a span."""

        def counted() -> None:
            self.iterations.begin()
            try:
                fn()
            finally:
                self.iterations.end()

        return counted

    def _marker(self, torch: Any) -> None:
        """Allocate and free a block of MARKER_BYTES between two readings of our clock."""
        before = time.time_ns()
        marker = torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
        del marker
        self.record["markers"].append([before, time.time_ns()])

    def _finish(self, torch: Any, snapshot: Any) -> None:
        """Write the record and the snapshot after the window (or the failure's)."""
        if snapshot is None:
            self._marker(torch)
        stats = torch.cuda.memory_stats(self.device)
        self.record["stats"] = {key: int(stats.get(key, 0)) for key in STATS}
        if self._model is not None:  # at a failure too: the traceback still holds what the workload held
            self.record["identities_end"] = identities(self._model, self._inputs, self._root, self.strings)
        if snapshot is None:
            t0 = time.perf_counter()
            snapshot = torch.cuda.memory._snapshot()
            self.record["end_snapshot_s"] = round(time.perf_counter() - t0, 3)
        self.record.update(
            end_snapshot_ns=time.time_ns(), strings=self.strings.names,
            ops=self.ops.calls if self.ops is not None else [], backward=self.backward.spans,
            optimizer=self.optimizer.spans, iterations=self.iterations.spans,
            run_mode=self.result.get("run_mode"), history_entries=HISTORY_ENTRIES, marker_bytes=MARKER_BYTES,
        )
        self._write(END, snapshot)
        write_json(self.folder / RECORD, self.record)
        self.result["artifacts"] += [name for name in (START, END, RECORD) if (self.folder / name).is_file()]

    def _write(self, name: str, snapshot: Any) -> None:
        path = self.folder / name
        tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as handle:
            pickle.dump(snapshot, handle, protocol=4)
        os.replace(tmp, path)


def _clear_history(torch: Any) -> bool:
    """Start the history afresh (the state before the window is in the start snapshot); False where this torch
    cannot clear it, and the engine starts at the window's time instead."""
    try:
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=HISTORY_ENTRIES, clear_history=True)
    except TypeError:
        return False
    return True


@contextlib.contextmanager
def capture_memory(enabled: bool, folder: Path, result: dict[str, Any]) -> Iterator[None]:
    """The memory pass's recording around a whole harness run when `enabled`, else nothing."""
    global _ACTIVE
    if not enabled:
        yield
        return
    with MemoryCapture(folder, result) as capture:
        _ACTIVE = capture
        try:
            yield
        finally:
            _ACTIVE = None


def watch(model: Any, inputs: Any, root: str, compile_mode: str) -> None:
    """Tell the memory pass (if one runs) which model and inputs the window uses."""
    if _ACTIVE is not None:
        _ACTIVE.watch(model, inputs, root, compile_mode)


def memory_step(fn: Callable[[], None]) -> Callable[[], None]:
    """The window's iteration, counted by the memory pass if one runs."""
    return _ACTIVE.step(fn) if _ACTIVE is not None else fn


def memory_window() -> contextlib.AbstractContextManager[None]:
    """The memory pass's recording around the measured window, or nothing."""
    return _ACTIVE.window() if _ACTIVE is not None else contextlib.nullcontext()
