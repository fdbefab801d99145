"""Call sites and worker threads of an eager window (standard library and torch only).

`CallSites` is a torch function mode: around every torch call it opens a `site:<path>:<line>` range (NVTX or
a profiler range) naming the innermost frame of the user's code that made it, so every kernel the call
launches carries its line. `ThreadCapture` makes threads started inside the window record like the thread
that opened it: torch's NVTX operator ranges and the mode are per thread, so each new thread turns both on
before its first line runs.
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

from mcp_server.children.contract import NODE_RANGE_PREFIX, RECORDINGS, SITE_RANGE_PREFIX

# Torch functions that only read a tensor's metadata: they launch nothing, so they open no range. (A tensor's value
# read by Python, `__bool__`, `__int__`, `__float__`, `__index__`, `__format__`, `__repr__`, copies it to the host
# and waits for the GPU: those calls keep their ranges, so the wait is named at its line: `if mask.all():`.)
_METADATA = frozenset({
    "size", "dim", "stride", "numel", "is_contiguous", "data_ptr", "element_size", "storage_offset", "__len__",
    "__hash__", "requires_grad_",
})


@functools.cache
def _roots() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(torch's, Inductor's generated code's and this package's folders, the standard library's, site-packages'),
    each real and ending in a separator. In a virtual environment the standard library's folder may hold
    site-packages."""
    import torch

    def real(paths: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({os.path.realpath(p) + os.sep for p in paths}))

    paths = sysconfig.get_paths()
    packages = [paths[k] for k in ("purelib", "platlib") if paths.get(k)]
    packages += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return (real([os.path.dirname(torch.__file__), inductor_cache_dir(), str(Path(__file__).resolve().parent)]),
            real(paths[k] for k in ("stdlib", "platstdlib") if paths.get(k)), real(packages))


def inductor_cache_dir() -> str:
    """The folder Inductor writes the Python code it generates to (`torch._inductor.runtime.cache_dir_utils.
    cache_dir()`, worked out as it does: importing it takes about 2 s)."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return os.path.abspath(configured)
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def is_core(path: str) -> bool:
    """Code under every model (torch, the standard library, this package), by its real path."""
    own, stdlib, packages = _roots()
    return path.startswith(own) or (path.startswith(stdlib) and not path.startswith(packages))


def library_roots() -> tuple[str, ...]:
    """Folders whose code is not the user's: torch, Inductor's generated code, the standard library, site-packages,
    this package."""
    return tuple(sorted(set().union(*_roots())))


class UserFrames:
    """Which code objects are the user's, and which a third-party library's (site-packages outside torch: a Hugging
    Face model's own lines), decided once per code object."""

    def __init__(self) -> None:
        self.roots = library_roots()
        self.known: dict[CodeType, bool] = {}
        self.third_party: dict[CodeType, bool] = {}

    def is_user(self, code: CodeType) -> bool:
        found = self.known.get(code)
        if found is None:
            name = code.co_filename
            found = self.known[code] = not (
                name.startswith("<") or os.path.realpath(name).startswith(self.roots)
            )
        return found

    def is_library(self, code: CodeType) -> bool:
        """Code of a library outside torch, the standard library and this package."""
        found = self.third_party.get(code)
        if found is None:
            name = code.co_filename
            found = self.third_party[code] = not (
                self.is_user(code) or name.startswith("<") or is_core(os.path.realpath(name)))
        return found

    def site(self, frame: FrameType | None) -> str | None:
        """`path:line` of the innermost user frame from `frame` outwards; without one (a library's model called by
        the harness), of the innermost third-party library frame; else None."""
        library = None
        while frame is not None:
            if self.is_user(frame.f_code):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            if library is None and self.is_library(frame.f_code):
                library = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return library


def site_ranges(profiler: str) -> tuple[Callable[[str], Any], Callable[[Any], None]]:
    """(open, close) of a named range for the window's profiler: NVTX push/pop, or a profiler range."""
    import torch

    if RECORDINGS[profiler].torch_profiler:
        def open_range(name: str) -> Any:
            ctx = torch.autograd.profiler.record_function(name)
            ctx.__enter__()
            return ctx

        return open_range, lambda ctx: ctx.__exit__(None, None, None)
    return torch.cuda.nvtx.range_push, lambda _: torch.cuda.nvtx.range_pop()


def keep_out_of_dynamo(*modules: ModuleType) -> None:
    """Have Dynamo never compile the code of `modules` (every function, method and nested class they define) as frames
    of their own; it still traces it inside the graphs it compiles, where the ranges do nothing. That code runs as a
    frame of its own where the user's code runs eagerly under torch.compile's frame callback (a function Dynamo
    skipped): compiled, a module hook or the call-site mode would be what tracing it left (no range), and the torch
    calls it passes on would run as Inductor's code. Called once Dynamo is loaded (a script's first compile)."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # a torch whose Dynamo keeps it in C only
        try:
            from torch._C._dynamo.eval_frame import skip_code  # type: ignore[attr-defined]
        except ImportError:
            return
    seen: set[CodeType] = set()

    def walk(code: CodeType) -> None:
        if code in seen:
            return
        seen.add(code)
        skip_code(code)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                walk(const)

    for module in modules:
        for value in vars(module).values():
            members = vars(value).values() if isinstance(value, type) else [value]
            for member in members:
                code = getattr(getattr(member, "fget", member), "__code__", None)
                if isinstance(code, CodeType) and code.co_filename == module.__file__:
                    walk(code)


# a call's frame -> (the module path, the user's line) of the FX node that made it, or None (`fx_graphs.FxNodes`)
GraphNodes = Callable[[FrameType | None], "tuple[str | None, str | None] | None"]


def call_sites(profiler: str, frames: UserFrames, active: bool = True, graph_nodes: GraphNodes | None = None) -> Any:
    """A TorchFunctionMode that wraps each torch call made from user code in a `site:` range while its `active` is
    true. Inside `torch.compile` it is traced away (Dynamo reads is_compiling() as True): a mode entered for a whole
    script, and switched on for its windows only, leaves the compiled graphs as they are without it, and Dynamo's
    guard on the mode stack holds from warm-up to window (a mode entered for a window alone would recompile there).
    A call made by an FX GraphModule's code run eagerly (`graph_nodes` finds its node) is wrapped in a `node:`
    range of the module its node came from too, and takes the node's line where the trace recorded one."""
    from torch.compiler import is_compiling
    from torch.overrides import TorchFunctionMode

    open_range, close_range = site_ranges(profiler)
    _fast_paths_see_through()

    class CallSites(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.active = active
            self.call_site_mode = True  # `_fast_paths_see_through` looks past it

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if is_compiling() or not self.active:
                return func(*args, **kwargs)
            name = getattr(func, "__name__", "")
            # a profiler range opened by the call outlives it: a range around it would end that one instead
            skip = name in _METADATA or name == "__get__" or "record_function" in name
            if skip:
                return func(*args, **kwargs)
            caller = sys._getframe(1)
            node = graph_nodes(caller) if graph_nodes is not None else None
            module, site = node if node is not None else (None, None)
            site = site or frames.site(caller)
            if site is None and module is None:
                return func(*args, **kwargs)
            handles = [open_range(prefix + text) for prefix, text in ((NODE_RANGE_PREFIX, module),
                                                                       (SITE_RANGE_PREFIX, site)) if text]
            try:
                return func(*args, **kwargs)
            finally:
                for handle in reversed(handles):
                    close_range(handle)

    return CallSites()


def _fast_paths_see_through() -> None:
    """Make `torch.overrides.has_torch_function` answer as if the call-site modes were not on the stack (once per
    process). nn.MultiheadAttention's and nn.TransformerEncoderLayer's fused inference kernels are skipped when it
    answers True, which any TorchFunctionMode makes it do: the profiled passes would run the slow path's kernels
    while a run without the profiler runs the fused ones. Those modules ask through the module attribute at each
    call; a mode of the user's, or a tensor subclass, still answers True."""
    import torch
    import torch.overrides as overrides
    from torch.compiler import is_compiling

    if getattr(overrides.has_torch_function, "sees_through_call_sites", False):
        return
    original = overrides.has_torch_function
    plain = (torch.Tensor, torch.nn.Parameter)

    def has_torch_function(args: Any) -> bool:
        if is_compiling():  # Dynamo's own answer for the original, in code it traces: a tensor subclass's override
            return any(isinstance(arg, torch.Tensor) and type(arg) not in plain for arg in args)
        stack = overrides._get_current_function_mode_stack()
        if not stack or not getattr(stack[-1], "call_site_mode", False):
            return original(args)
        with overrides._pop_mode_temporarily():
            return has_torch_function(args)

    has_torch_function.sees_through_call_sites = True  # type: ignore[attr-defined]
    has_torch_function.original = original  # type: ignore[attr-defined]
    overrides.has_torch_function = has_torch_function


def dynamo_folds_has_torch_function() -> None:
    """Have Dynamo fold the original `has_torch_function` to a constant, as it does without the call-site modes.
    Its table of such functions is keyed on what `torch.overrides` holds when the table is built: after
    `_fast_paths_see_through` (a script's call-site modes, entered before its first compile), the replacement, not
    the C function torch's own Python code imported (`torch/_tensor.py`'s operators). Traced as a torch call
    returning a bool, it broke the graph of every such operator, and an optimizer's step compiled by the script (a
    tensor learning rate's `1 - lr`) ran eagerly. Called once Dynamo is loaded (a script's first compile)."""
    import torch.overrides as overrides

    replaced = overrides.has_torch_function
    original = getattr(replaced, "original", None)
    try:
        from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
    except ImportError:
        return
    if original is None or not hasattr(TorchInGraphFunctionVariable, "_get_handlers"):
        return
    TorchInGraphFunctionVariable._get_handlers.cache_clear()
    overrides.has_torch_function = original
    try:
        handlers = TorchInGraphFunctionVariable._get_handlers()
    finally:
        overrides.has_torch_function = replaced
    if original in handlers:
        handlers[replaced] = handlers[original]


class ThreadCapture:
    """While open, every thread started through `threading` records its operators (NVTX, as `emit_nvtx` does on
    the opening thread) and its call sites before its first line runs. A thread that outlives the window keeps
    recording; its later ranges fall outside the measured window. Opened for a whole script, so that a pool of
    worker threads started in its warm-up is seen, its threads' call sites are recorded while it is `active`.
    Autograd runs a backward with the profiler's state but none of the caller's torch function modes (a GPU's on
    its device thread, a C++ thread): a custom `autograd.Function`'s backward (reentrant checkpointing's
    recomputation among them) runs under a call-site mode of its thread's own, and so does each gradient hook the
    workload registered once `GradientHooks` was installed."""

    def __init__(self, profiler: str, record_shapes: bool, frames: UserFrames | None, active: bool = True,
                 graph_nodes: GraphNodes | None = None) -> None:
        self.profiler = profiler
        self.record_shapes = record_shapes
        self.frames = frames
        self.graph_nodes = graph_nodes
        self._previous: Any = None
        self._active = active
        self._modes: list[Any] = []  # each thread's call-site mode
        self._local = threading.local()  # an autograd thread's mode
        self._apply: Any = None  # `BackwardCFunction.apply` as it was

    @property
    def active(self) -> bool:
        """Whether the threads' call sites are recorded now."""
        return self._active

    @active.setter
    def active(self, on: bool) -> None:
        self._active = on
        for mode in list(self._modes):
            mode.active = on

    def _start_thread(self, frame: FrameType, event: str, arg: object) -> None:
        sys.setprofile(self._previous)
        import torch
        from torch.autograd.profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

        if RECORDINGS[self.profiler].nvtx and not torch.autograd._profiler_enabled():
            torch.autograd._enable_profiler(
                ProfilerConfig(ProfilerState.NVTX, self.record_shapes, False, False, False, False,
                               _ExperimentalConfig()),
                set(),
            )
        if self.frames is not None:
            mode = call_sites(self.profiler, self.frames, active=self._active, graph_nodes=self.graph_nodes)
            self._modes.append(mode)
            mode.__enter__()  # the thread's own mode stack; ends with it

    def _thread_mode(self) -> Any:
        """This thread's call-site mode when none is on its mode stack (an autograd thread's), else None."""
        from torch.overrides import _get_current_function_mode_stack

        if self.frames is None or any(getattr(m, "call_site_mode", False) for m in _get_current_function_mode_stack()):
            return None
        mode = getattr(self._local, "mode", None)
        if mode is None:
            mode = self._local.mode = call_sites(self.profiler, self.frames, active=self._active,
                                                 graph_nodes=self.graph_nodes)
            self._modes.append(mode)
        return mode

    def __enter__(self) -> ThreadCapture:
        from torch.autograd.function import BackwardCFunction

        self._previous = threading.getprofile()
        threading.setprofile(self._start_thread)
        original = self._apply = BackwardCFunction.apply
        capture = self

        def apply(node: Any, *args: Any) -> Any:  # autograd's engine looks `apply` up on each node it runs
            mode = capture._thread_mode()
            if mode is None:
                return original(node, *args)
            with mode:
                return original(node, *args)

        BackwardCFunction.apply = apply
        _CAPTURES.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from torch.autograd.function import BackwardCFunction

        threading.setprofile(self._previous)
        if self in _CAPTURES:
            _CAPTURES.remove(self)
        if self._apply is not None:
            BackwardCFunction.apply = self._apply
            self._apply = None


_CAPTURES: list[ThreadCapture] = []  # the thread captures open now, innermost last


class GradientHooks:
    """Autograd runs a tensor's Python hooks (`register_hook`: a gradient clipped as it is computed) and a leaf's
    (`register_post_accumulate_grad_hook`: an optimizer stepped inside the backward) where it runs a backward, with
    none of the caller's torch function modes. Installed before the workload registers them, each hook is wrapped
    so that, while a `ThreadCapture` is open, it runs under its thread's call-site mode: its work is at its own
    lines."""

    REGISTERS = ("register_hook", "register_post_accumulate_grad_hook")

    def __init__(self) -> None:
        self._originals: dict[str, Any] = {}

    def install(self) -> GradientHooks:
        """Wrap the hooks registered from now on."""
        import torch

        for name in self.REGISTERS:
            original = getattr(torch.Tensor, name)
            if not getattr(original, "wraps_gradient_hooks", False):  # once, however many are installed
                self._originals[name] = original
                setattr(torch.Tensor, name, _registering(original))
        return self

    def remove(self) -> None:
        """Register hooks as torch does again (those wrapped stay wrapped, and run as they are once no capture is
        open)."""
        import torch

        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals = {}


def _registering(register: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(register)
    def registered(tensor: Any, hook: Callable[..., Any]) -> Any:
        return register(tensor, _under_call_sites(hook))

    registered.wraps_gradient_hooks = True  # type: ignore[attr-defined]
    return registered


def _under_call_sites(hook: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(hook)
    def run(*args: Any) -> Any:
        mode = _CAPTURES[-1]._thread_mode() if _CAPTURES else None
        if mode is None:
            return hook(*args)
        with mode:
            return hook(*args)

    return run
