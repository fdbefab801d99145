"""Module ranges of a script that never hands its model over: torch's global module hooks (standard library and
torch only).

`GlobalModules` installs `register_module_forward_pre_hook` / `register_module_forward_hook` once, for every module
of every model the script builds. A module called while no other is running is a root: its path is its class name
(as the contract's `ModuleRanges` names the model), its descendants' the paths `named_modules()` gives them under
it. A later root whose paths another root holds (a second model of the same class, or one with a `head` too) has its
descendants' paths under its own name (`ViT.head`, `Decoder[1].blocks.0`), so no two modules share a path.
While `ranging` is on, every call is wrapped in a `module:<path>` range (NVTX, or a profiler range for
torch.profiler); `calls` turns profiling on only during chosen calls (a shape-variant replay), counted from
`start_counting()` (the window's start) until `stop_counting()`. `listeners` are told of every call's start and end
(the step driver counts module steps there).
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from mcp_server.children.contract import MODULE_RANGE_PREFIX, RECORDINGS, SITE_RANGE_PREFIX
from mcp_server.children.fx_graphs import node_module_path
from mcp_server.children.naming import GRAPH_MODULE, SCRIPTED, root_module_name, traced_classes
from mcp_server.children.sites import UserFrames, site_ranges

# (module, path, started, its positional arguments): started False, and no arguments, once its call returned
Listener = Callable[[Any, str, bool, tuple[Any, ...]], None]
COMPILER_PACKAGES = ("torch._dynamo.", "torch._inductor.", "torch._functorch.")


class GlobalModules:
    """Every module call of the process, named by its path; ranges around them while `ranging` is on."""

    def __init__(self, profiler: str, calls: list[tuple[str, int]] | None = None,
                 switch: Callable[[bool], None] | None = None) -> None:
        import torch.fx._symbolic_trace as symbolic
        from torch.compiler import is_compiling
        from torch.nn import DataParallel

        fx_tracing = getattr(symbolic, "is_fx_symbolic_tracing", symbolic.is_fx_tracing)
        # true while Dynamo traces a hook, or `torch.fx.symbolic_trace` a model: a hook then does nothing (`_pre`;
        # a traced model is no root: its GraphModule, named by the same class, is the one called)
        self._compiling = lambda: is_compiling() or fx_tracing()
        self.profiler = profiler
        self.ranging = False
        self.roots: list[str] = []  # class names of the roots seen, in order
        self.scripted: list[str] = []  # the roots that are TorchScript modules
        self.frames: UserFrames | None = None  # given: a TorchScript module's call opens a range of its caller's line
        self.listeners: list[Listener] = []
        self.open_range: Callable[[str], Any] | None = None
        self.close_range: Callable[[Any], None] | None = None
        if RECORDINGS[profiler].ranged:
            self.open_range, self.close_range = site_ranges(profiler)
        self._paths: dict[int, dict[int, str]] = {}  # id(root) -> id(module) -> path
        self._classes: dict[str, str] = {}  # path -> class name
        self._prefixed: set[str] = set()  # the roots whose descendants' paths begin with their names
        self._parallel: dict[int, Any] = {}  # id -> the `nn.DataParallel` wrappers among the modules named
        self._data_parallel = DataParallel
        self._param_paths: dict[int, tuple[str, str]] = {}  # id(parameter) -> (its root, its module's path)
        self._local = threading.local()
        self._handles: list[Any] = []
        self._wanted: dict[str, set[int]] = {}
        for path, number in calls or []:
            self._wanted.setdefault(path, set()).add(number)
        self._switch = switch
        self._seen: dict[str, int] = {}
        self._counting = False  # calls count (and a chosen one is profiled) only inside a window
        self._depth = 0
        self.started = 0  # profiled calls started (a variant replay)

    def install(self, only: Iterable[Any] | None = None) -> GlobalModules:
        """Register the global hooks (once); with `only`, hooks on those modules alone (a module called outside them
        is not seen)."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        # Where Dynamo is loaded already, never traced: a module whose `_call_impl` runs eagerly inside a compiled
        # call (`torch.compile(model)` compiles its forward) calls them while Dynamo compiles every new frame, and
        # Dynamo would compile them too. Installed before Dynamo (a script's start), they are traced away inside the
        # graphs the script compiles later (`_pre`). (Dynamo is not imported for this: it would cost every script's
        # pass seconds.)
        dynamo = sys.modules.get("torch._dynamo")
        pre, post = (dynamo.disable(self._pre), dynamo.disable(self._post)) if dynamo else (self._pre, self._post)
        # `always_call`: a call that raises still ends its range (activation checkpointing stops its recomputation
        # by raising inside the modules it re-runs)
        if only is None:
            self._handles = [register_module_forward_pre_hook(pre),
                             register_module_forward_hook(post, always_call=True)]
        else:
            self._handles = [h for m in only for h in (m.register_forward_pre_hook(pre),
                                                       m.register_forward_hook(post, always_call=True))]
        return self

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def scoped(self) -> bool:
        """Profiling is switched on only during chosen calls (a shape-variant replay)."""
        return bool(self._wanted)

    def start_counting(self) -> None:
        """Call numbers of `calls` count from now (the window's start); before it, no call is profiled (a script's
        warm-up steps run the same module calls: profiled, ncu would replay each chosen call twice)."""
        self._seen.clear()
        self._counting = True

    def stop_counting(self) -> None:
        """No call is profiled from now (the window's end)."""
        self._counting = False

    def modules(self) -> dict[str, str]:
        """Every path seen under a root, with its class name."""
        return dict(self._classes)

    def inside_call(self) -> bool:
        """A module call is running on this thread (a listener told of a call's start or end: the call itself not
        counted, so False means the call is a root's)."""
        return bool(self._stack())

    def _stack(self) -> list[tuple[Any, str, Any, bool]]:
        stack: list[tuple[Any, str, Any, bool]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def path_of(self, module: Any, stack: list[tuple[Any, str, Any, bool]]) -> str:
        """The module's path: under the root of the calls it runs inside, else under any root seen, else under the
        outermost module whose method calls it (its own call began before the hooks: a CUDA graph captured inside
        its forward), else it is a root itself (its class name)."""
        key = id(module)
        if stack:
            found = self._paths.get(id(stack[0][0]), {}).get(key)
            if found is not None:
                return found
        for paths in self._paths.values():
            if key in paths:
                return paths[key]
        owner = None if stack else _calling_owner(module)
        if owner is not None:
            self.path_of(owner, stack)
            return self._paths[id(owner)][key]
        if getattr(module, "_is_replica", False):
            replica = self._replica_paths(module)
            if replica is not None:
                return replica
        root = root_module_name(module)  # torch.compile's wrapper is named as the module it wraps
        members = [(_unwrapped(p), m) for p, m in getattr(module, "_orig_mod", module).named_modules()]
        # a second model whose paths another root holds already (two models of one class, or both with a `head`)
        # is named in full, from its class name (numbered when another root has it: `Decoder[1].blocks.0`)
        prefixed = bool(stack) or any((p or root) in self._classes for p, _ in members)
        if not stack and prefixed:
            # a second model of a class another holds is named by the script's variable for it (`student`), where
            # a frame of the user's code has one; else numbered
            named = _variable_name(module, self.frames) if root in self._classes else None
            root = _distinct(named or root, self._classes)
        paths = self._paths[key] = {key: root}
        self._parallel.update((id(m), m) for _, m in members if isinstance(m, self._data_parallel))
        traced = traced_classes(module)  # an exported program holds its model's hierarchy as bare containers
        for p, m in members:
            paths[id(m)] = (f"{root}.{p}" if prefixed and p else p) or root
            self._classes[paths[id(m)]] = traced.get(p) or root_module_name(m)
            if not stack:
                for param in m.parameters(recurse=False):
                    self._param_paths.setdefault(id(param), (root, paths[id(m)]))
        for p, name in traced.items():  # modules the program keeps no container for (`graph_node_path`)
            self._classes.setdefault(f"{root}.{p}" if prefixed else p, name)
        if prefixed:
            self._prefixed.add(root)
        if not stack:
            self.roots.append(root)
            if type(module).__name__ == SCRIPTED:
                self.scripted.append(root)
        return self._paths[key][key]

    def _replica_paths(self, replica: Any) -> str | None:
        """The path of a module `nn.DataParallel` replicated onto another GPU for one forward (called on a thread of
        its own, with no call above it there): its paths are those of the module it copies, so the GPUs' work adds
        up by module; None when no DataParallel seen holds a module of its class. Its entry goes with it (every
        forward makes new replicas, whose ids come back)."""
        for wrapper in list(self._parallel.values()):
            if type(wrapper.module) is not type(replica):
                continue
            base = next((paths[id(wrapper.module)] for paths in list(self._paths.values())
                         if id(wrapper.module) in paths), None)
            if base is None:
                continue
            key = id(replica)
            self._paths[key] = {id(m): f"{base}.{p}" if p else base for p, m in replica.named_modules()}
            weakref.finalize(replica, self._paths.pop, key, None)
            return base
        return None

    def graph_node_path(self, owner: Any, module_path: str) -> str | None:
        """The path of the module an eagerly run GraphModule's node came from: the module `owner` holds at
        `module_path` (`torch.export` keeps the model's hierarchy as bare containers), named as a call of it would
        be; a module it keeps no container for, by its path under the innermost it keeps."""
        stack = self._stack()
        return node_module_path(owner, module_path, lambda module: self.path_of(module, stack),
                                lambda path: path in self.roots and path not in self._prefixed)

    def owner(self, params: Iterable[Any]) -> str | None:
        """The innermost module holding every one of `params` (an optimizer's): their modules' longest common path,
        else their root; None when they are of several roots, or of none seen."""
        seen = {self._param_paths.get(id(p)) for p in params}
        found = {f for f in seen if f is not None}
        if not found or len(found) != len(seen) or len({root for root, _ in found}) != 1:
            return None
        root = next(iter(found))[0]
        return ".".join(os.path.commonprefix([path.split(".") for _, path in found])) or root

    def _pre(self, module: Any, args: Any) -> None:
        # Traced away inside `torch.compile` (Dynamo reads is_compiling() as True): the compiled graph keeps no trace
        # of the hooks and breaks nowhere for them (disabled hooks would break it at every module); its kernels take
        # their modules from Inductor's graph instead.
        if self._compiling() or self._compiler_made(module):
            return
        stack = self._stack()
        path = self.path_of(module, stack)
        for listener in self.listeners:
            listener(module, path, True, args)
        handles = []
        if self.ranging and self.open_range:
            handles.append(self.open_range(MODULE_RANGE_PREFIX + path))
            if self.frames is not None and (type(module).__name__ == SCRIPTED or not stack and not _in_backward()):
                # The line that called a root (`ddp(x)`): what the model's wrapper runs with no torch call of the
                # script's around it (DDP's buffer broadcast, DataParallel's scatter) was caused there. TorchScript
                # runs the forward in its own interpreter (no module hook or call-site range inside it): its
                # operators take the line that called it. A torch call inside keeps its own, the innermost. A module
                # a backward node calls again (activation checkpointing) takes its forward call's line instead.
                site = self.frames.site(sys._getframe(1))
                if site is not None:
                    handles.append(self.open_range(SITE_RANGE_PREFIX + site))
        profiled = False
        if self._counting and path in self._wanted:
            number = self._seen.get(path, 0)
            self._seen[path] = number + 1
            profiled = number in self._wanted[path]
            if profiled:
                self._depth += 1
                if self._depth == 1 and self._switch is not None:
                    self.started += 1
                    self._switch(True)
        stack.append((module, path, handles, profiled))

    @staticmethod
    def _compiler_made(module: Any) -> bool:
        """A module the compiler made, not the script: Dynamo's DDP optimizer runs the graph it split at DDP's buckets
        as a GraphModule calling one `WrapperModule` per bucket's piece. Their kernels take their modules from
        Inductor's graph, as in any compiled call."""
        return _compiler_class(module) or (
            type(module).__name__ == GRAPH_MODULE and any(_compiler_class(m) for m in module.children()))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling() or self._compiler_made(module):
            return
        stack = self._stack()
        if not stack or stack[-1][0] is not module:
            return  # a call whose pre-hook ran before the hooks were installed
        _, path, handles, profiled = stack.pop()
        if profiled:
            self._depth -= 1
            if self._depth == 0 and self._switch is not None:
                self._switch(False)
        if self.close_range is not None:
            for handle in reversed(handles):
                self.close_range(handle)
        for listener in self.listeners:
            listener(module, path, False, ())


def _in_backward() -> bool:
    """Whether autograd's engine is running a node on this thread (a checkpointed module's forward run again)."""
    import torch

    return torch._C._current_autograd_node() is not None


def _compiler_class(module: Any) -> bool:
    """Whether the module's class is the compiler's own (Dynamo's, Inductor's, AOTAutograd's)."""
    return type(module).__module__.startswith(COMPILER_PACKAGES)


def _variable_name(module: Any, frames: UserFrames | None) -> str | None:
    """The name the innermost frame of the user's code that holds `module` gives it: a local or global variable (the
    first bound to it, in the order the code names them), else an attribute of that frame's `self`; None without
    one (or without `frames` to tell the user's code)."""
    if frames is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frames.is_user(frame.f_code):
            for name, value in {**frame.f_globals, **frame.f_locals}.items():
                if value is module and name.isidentifier() and not name.startswith("_"):
                    return name
            owner = frame.f_locals.get("self")
            for name, value in (vars(owner).items() if hasattr(owner, "__dict__") else ()):
                if value is module and not name.startswith("_"):
                    return name
            for name, value in (getattr(owner, "_modules", None) or {}).items():
                if value is module:
                    return name
        frame = frame.f_back
    return None


def _distinct(name: str, taken: dict[str, str]) -> str:
    """`name`, or `name[1]`, `name[2]`... : the first no module holds as its path."""
    if name not in taken:
        return name
    return next(f"{name}[{n}]" for n in range(1, len(taken) + 2) if f"{name}[{n}]" not in taken)


def _unwrapped(path: str) -> str:
    """A `named_modules()` path without the `_orig_mod` steps of `torch.compile`'s wrappers (`blocks._orig_mod.0`
    -> `blocks.0`): the paths the model has uncompiled, as Dynamo's graphs name them."""
    return ".".join(part for part in path.split(".") if part != "_orig_mod")


def _calling_owner(module: Any) -> Any:
    """The outermost module, other than `module`, that holds it and has a method running on this thread's stack
    (a frame whose `self` it is); None when there is none. `torch.compile`'s wrapper of a module is that module."""
    from torch import nn

    compiled = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", ())  # none before Dynamo
    owner = None
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if (isinstance(candidate, nn.Module) and not isinstance(candidate, compiled) and candidate is not module
                and any(m is module for m in candidate.modules())):
            owner = candidate
        frame = frame.f_back
    return owner
