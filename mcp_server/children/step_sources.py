"""Where a script's steps end, found without editing it (standard library and torch only): its optimizers' steps
(`OptimizerSteps`), its `backward()` calls (`BackwardSteps`), or calls of a function or module class it names
(`NamedSteps`). Each tells the script's `StepWindows` as a step begins or ends.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType, MethodType
from typing import Any, Protocol

from mcp_server.children.closures import around_closure
from mcp_server.children.common import ContractError
from mcp_server.children.contract import CLOSURE_RANGE, STEP_OF_PREFIX, UPDATE_RANGE
from mcp_server.children.eager_hooks import run_hooks_eagerly
from mcp_server.children.global_modules import GlobalModules
from mcp_server.children.naming import root_module_name
from mcp_server.children.sites import is_core


class StepWindows(Protocol):
    """What a source of steps tells the script's windows (`mcp_server.children.steps.StepWindows`)."""

    opens_at_start: bool

    @property
    def opened(self) -> bool: ...

    def step_begins(self) -> None: ...

    def step_ended(self) -> None: ...

    def recount(self) -> None: ...


class OptimizerSteps:
    """Steps of a training loop's optimizers. A step ends as the loop's last optimizer returns: the one seen stepping
    for the first time last (a GAN's generator after its discriminator, a critic's generator after its five critic
    steps), so a window holds whole iterations. Until a window opens, each optimizer seen stepping for the first time
    moves the boundary to it, its first step ending the loop's first iteration; one first seen later is warned of.
    A step's end is seen through torch's global post-hook until the boundary's optimizer is wrapped, then through a
    wrapper of its `step` (outside its `Optimizer.step#...` profiler range, where the window opens and closes). A
    step run inside a backward (an optimizer fused into it by a post-accumulate-grad hook) ends once that backward has
    returned.

    While a window records ranges, each optimizer's step runs inside a `STEP_OF_PREFIX` range naming the innermost
    module holding every parameter it updates (when one root holds them all): the update's work is that module's."""

    kind = "optimizer"

    def __init__(self, windows: StepWindows, modules: GlobalModules) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.windows, self.modules = windows, modules
        windows.opens_at_start = False
        self.optimizer: Any = None  # the boundary's optimizer
        self.late: list[str] = []  # optimizers first seen stepping after a window opened
        self._seen: set[int] = set()
        self._inside: Any = None  # the optimizer stepping through its wrapper
        self._owners: dict[int, str | None] = {}  # id(optimizer) -> the module holding its parameters
        self._ranges: list[Any] = []
        self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
        self.name = "optimizer step"
        self._thread = threading.get_ident()  # the script's
        self._compiling = torch.compiler.is_compiling
        self._backwards = 0  # backward() calls of the script's thread running now
        self._deferred: list[Callable[[], None]] = []  # steps' ends waiting for the outermost backward to return
        self._restore: list[Callable[[], None]] = []
        for owner in (torch.Tensor, torch.autograd):  # Tensor.backward calls torch.autograd.backward
            original = owner.backward
            owner.backward = self._backward(original)
            self._restore.append(functools.partial(setattr, owner, "backward", original))

    def _boundary(self, end: Callable[[], None]) -> None:
        """Run a step's end now; or, when the step ran inside a backward (an optimizer stepped from a gradient hook,
        on autograd's device thread), once the outermost backward has returned to the script's thread: a window opens
        and closes on the thread that runs the script, between whole backwards."""
        if self._backwards or threading.get_ident() != self._thread:
            self._deferred.append(end)
        else:
            end()

    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        steps = self

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if steps._compiling():  # inside a graph the script compiles: Dynamo breaks it at the backward itself
                return original(*args, **kwargs)
            on_script = threading.get_ident() == steps._thread
            steps._backwards += on_script
            try:
                return original(*args, **kwargs)
            finally:
                if on_script:
                    steps._backwards -= 1
                    while not steps._backwards and steps._deferred:
                        steps._deferred.pop(0)()

        return counted

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """While ranging, open the step's `STEP_OF_PREFIX` range and put its closure, if any, in `CLOSURE_RANGE`."""
        if self._compiling():  # a step the script compiled: its hooks and ranges run eagerly around the graphs
            run_hooks_eagerly()
        open_range, close_range = self.modules.open_range, self.modules.close_range
        if not (self.modules.ranging and open_range and close_range):
            return None
        key = id(optimizer)
        if key not in self._owners:
            self._owners[key] = self.modules.owner(p for g in optimizer.param_groups for p in g["params"])
        owner = self._owners[key]
        self._ranges.append(open_range(STEP_OF_PREFIX + owner) if owner is not None else None)
        ranges: list[Any] = []
        return around_closure(args, kwargs, lambda: ranges.append(open_range(CLOSURE_RANGE)),
                              lambda: close_range(ranges.pop()))

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._compiling():
            run_hooks_eagerly()
        self._end_range()
        if id(optimizer) in self._seen:
            if optimizer is self.optimizer and self._inside is not optimizer:
                self._boundary(self.windows.step_ended)  # a step called past the wrapper (the class's step, unbound)
            return
        self._seen.add(id(optimizer))
        if self.windows.opened:
            self.late.append(type(optimizer).__name__)
            return
        first = self.optimizer is None
        self.optimizer = optimizer
        self.name = f"{type(optimizer).__name__}.step"
        self._wrap(optimizer)
        # the first step did not run through the wrapper; a later optimizer's first step ends the first iteration
        self._boundary(self.windows.step_ended if first else self.windows.recount)

    def _wrap(self, optimizer: Any) -> None:
        previous = optimizer.step  # bound, or a scheduler's wrapper set on the instance
        steps = self

        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if steps._compiling():  # a step the script compiled: the hooks, run eagerly around it, count it
                return previous(*args, **kwargs)
            steps._inside = self
            try:
                out = previous(*args, **kwargs)
            finally:
                steps._inside = None
            if self is steps.optimizer:
                steps._boundary(steps.windows.step_ended)
            return out

        optimizer.step = MethodType(functools.wraps(previous)(step), optimizer)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        for restore in self._restore:
            restore()
        while self._ranges:
            self._end_range()

    def _end_range(self) -> None:
        handle = self._ranges.pop() if self._ranges else None
        if handle is not None and self.modules.close_range is not None:
            self.modules.close_range(handle)


class BackwardSteps:
    """Steps that end as each outermost `backward()` returns (`Tensor.backward` or `torch.autograd.backward`): a
    training script that updates its parameters without torch.optim. A window opens as a backward ends, so it holds
    that step's update, the next steps' forwards and backwards, and the loop's own code between them. That code, from
    a backward's end to the next module call (or backward), runs inside the `UPDATE_RANGE` profiler range: the
    optimizer phase of a hand-written loop (its update, and whatever else the loop does there)."""

    kind = "backward"
    name = "backward()"

    def __init__(self, windows: StepWindows, modules: GlobalModules) -> None:
        import torch

        self.windows, self.modules = windows, modules
        windows.opens_at_start = False
        self.depth = 0
        self._update: Any = None  # the open UPDATE_RANGE record_function
        self._restore: list[Callable[[], None]] = []
        for owner in (torch.Tensor, torch.autograd):  # Tensor.backward calls torch.autograd.backward: counted once
            original = owner.backward
            owner.backward = self._wrapper(original)
            self._restore.append(functools.partial(setattr, owner, "backward", original))
        modules.listeners.insert(0, self._called)

    def _called(self, module: Any, path: str, started: bool, args: tuple[Any, ...]) -> None:
        if started:
            self._end_update()

    def _end_update(self) -> None:
        if self._update is not None:
            update, self._update = self._update, None
            update.__exit__(None, None, None)

    def _wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        steps = self

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            import torch

            if steps.depth == 0:
                steps._end_update()
            steps.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                steps.depth -= 1
                if steps.depth == 0:
                    steps.windows.step_ended()  # the window opens here: the update's range inside it
                    steps._update = torch.autograd.profiler.record_function(UPDATE_RANGE)
                    steps._update.__enter__()

        return counted

    def remove(self) -> None:
        self._end_update()
        for restore in self._restore:
            restore()
        if self._called in self.modules.listeners:
            self.modules.listeners.remove(self._called)


class NamedSteps:
    """Steps that are the outermost calls of what `--window-fn` names: an nn.Module class (its calls, through the
    global module hooks), else a function or method (`name`, or `Class.name`).

    A function's first call is seen running at its first module call (the frames on the stack), or, in a script
    that calls no module, as it begins (`FunctionStarts`, on until the name is seen); the callable the script finds
    (the class attribute, or each globals entry naming it, decorators included) is then replaced by a wrapper that
    counts every later call; that first call ends as the next one begins."""

    def __init__(self, windows: StepWindows, modules: GlobalModules, name: str) -> None:
        self.windows, self.modules, self.name = windows, modules, name
        self.kind: str | None = None  # "module" or "function", once the name is seen
        self.where: str | None = None
        self.depth = 0
        self._first_pending = False
        self._restore: list[Callable[[], None]] = []
        modules.listeners.insert(0, self._called)
        self._starts = FunctionStarts(self._matches_code, self._started)

    @property
    def found(self) -> bool:
        return self.kind is not None

    def _started(self, frame: FrameType) -> bool:
        """A function of the name began: look for the outermost call of it; whether to stop watching."""
        if self.kind is None:
            self._look(frame)
        return self.kind is not None

    def _called(self, module: Any, path: str, started: bool, args: tuple[Any, ...]) -> None:
        if self.kind != "function" and root_module_name(module) == self.name.rsplit(".", 1)[-1]:
            if self.kind is None:
                self._starts.stop()  # a module class: no function start to watch for
            self.kind = "module"
            self.depth += 1 if started else -1
            if started and self.depth == 1:
                self.windows.step_begins()
            elif not started and self.depth == 0:
                self.windows.step_ended()
        elif self.kind is None and started:
            self._look(sys._getframe(2))

    def _matches_code(self, code: CodeType) -> bool:
        """Whether `code` is what the name names: a function of the script, or of a library it imports (a
        Hugging Face model's `generate`); never one of the standard library's or this package's (`os` has an
        `encode` of its own, called as the script reads its environment)."""
        if "." in self.name:
            qualified = getattr(code, "co_qualname", code.co_name)
            named = bool(qualified == self.name or qualified.endswith("." + self.name))
        else:
            named = code.co_name == self.name
        return named and not code.co_filename.startswith("<frozen") and not is_core(os.path.realpath(code.co_filename))

    def _look(self, frame: FrameType | None) -> None:
        outermost = None
        while frame is not None:
            if self._matches_code(frame.f_code):
                outermost = frame
            frame = frame.f_back
        if outermost is None:
            return
        self.kind = "function"
        self._starts.stop()
        if not self._wrap(outermost):
            raise ContractError(f"--window-fn {self.name}: its call at {outermost.f_code.co_filename}:"
                                f"{outermost.f_lineno} runs, but no class or module attribute names it, so its later "
                                "calls cannot be counted; name the nn.Module class it calls instead")
        self._first_pending = True  # this first call is under way, not wrapped: it ends as the next call begins

    def _wrap(self, frame: FrameType) -> bool:
        code, short = frame.f_code, self.name.rsplit(".", 1)[-1]

        def runs(candidate: Any) -> bool:
            try:
                return candidate is not None and getattr(inspect.unwrap(candidate), "__code__", None) is code
            except ValueError:
                return False

        owners: list[tuple[Any, bool]] = []
        target = frame.f_locals.get("self", frame.f_locals.get("cls"))
        if target is not None:
            for klass in (target if isinstance(target, type) else type(target)).__mro__:
                found = klass.__dict__.get(short)
                if runs(found) and not isinstance(found, (staticmethod, classmethod)):
                    owners.append((klass, True))
                    break
        caller: FrameType | None = frame
        seen: set[int] = set()
        while caller is not None:  # every module namespace on the stack that names it (an import, the script)
            scope = caller.f_globals
            if id(scope) not in seen and runs(scope.get(short)):
                owners.append((scope, False))
            seen.add(id(scope))
            caller = caller.f_back
        for owner, is_class in owners:
            original = owner.__dict__[short] if is_class else owner[short]
            wrapper = self._wrapper(original)
            if is_class:
                setattr(owner, short, wrapper)
                self._restore.append(functools.partial(setattr, owner, short, original))
            else:
                owner[short] = wrapper
                self._restore.append(functools.partial(owner.__setitem__, short, original))
        self.where = f"{code.co_filename}:{code.co_firstlineno}"
        return bool(owners)

    def _wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        steps = self

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            steps.depth += 1
            if steps.depth == 1:
                if steps._first_pending:
                    steps._first_pending = False
                    steps.windows.step_ended()  # the first call, seen running, has returned
                steps.windows.step_begins()
            try:
                return original(*args, **kwargs)
            finally:
                steps.depth -= 1
                if steps.depth == 0:
                    steps.windows.step_ended()

        return counted

    def remove(self) -> None:
        self._starts.stop()
        for restore in self._restore:
            restore()
        if self._called in self.modules.listeners:
            self.modules.listeners.remove(self._called)


class FunctionStarts:
    """Watches Python functions begin until `found(frame)` says to stop: each start of a function whose code
    `matches` (a function's: a class body of that name, run as its class is defined, is none). Through
    `sys.monitoring` where there is one (Python 3.12: every other code object is disabled after its first start,
    so the watch costs nothing once the script's functions have run), else a profile function (`sys.setprofile`:
    a callback at every call and return while it is on: an import-heavy start took twice as long on 3.11)."""

    def __init__(self, matches: Callable[[CodeType], bool], found: Callable[[FrameType], bool]) -> None:
        self.matches, self.found = matches, found
        self._monitoring: Any = getattr(sys, "monitoring", None)
        self._tool: int | None = None
        if self._monitoring is not None:
            tool = self._monitoring.PROFILER_ID
            try:
                self._monitoring.use_tool_id(tool, "operator-profiler")
            except ValueError:  # another tool holds it (a profiler of the user's): watch with a profile function
                self._monitoring = None
            else:
                self._tool = tool
                self._monitoring.register_callback(tool, self._monitoring.events.PY_START, self._py_start)
                self._monitoring.set_events(tool, self._monitoring.events.PY_START)
                return
        self._previous = sys.getprofile()
        self._hook = self._call  # one bound method: what getprofile() gives back is compared with it
        sys.setprofile(self._hook)

    def _wanted(self, code: CodeType) -> bool:
        return bool(code.co_flags & inspect.CO_OPTIMIZED) and self.matches(code)

    def _py_start(self, code: CodeType, offset: int) -> Any:
        if not self._wanted(code):
            return self._monitoring.DISABLE
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code is not code:  # the frame that began, below this callback's
            frame = frame.f_back
        if frame is not None and self.found(frame):
            self.stop()
        return None

    def _call(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and self._wanted(frame.f_code) and self.found(frame):
            self.stop()

    def stop(self) -> None:
        """Stop watching (again: nothing)."""
        if self._tool is not None:
            tool, self._tool = self._tool, None
            self._monitoring.set_events(tool, 0)
            self._monitoring.register_callback(tool, self._monitoring.events.PY_START, None)
            self._monitoring.free_tool_id(tool)
        elif self._monitoring is None and sys.getprofile() is self._hook:
            sys.setprofile(self._previous)
