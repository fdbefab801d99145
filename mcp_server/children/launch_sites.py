"""Call sites of the kernels a workload launches itself (standard library and torch only; Triton where the workload
imported it).

A `@triton.jit` function called from the workload's code (`_rms_forward[grid](...)`, in a `torch.autograd.Function`),
or a kernel compiled with NVRTC (`torch.cuda._compile_kernel(source, name)(grid=..., args=...)`), launches with no
torch call around it, so the call-site mode never sees it. Triton calls a hook around every launch
(`triton.knobs.runtime.launch_enter_hook` / `launch_exit_hook`), and an NVRTC kernel launches through
`torch.cuda._utils._CudaKernel.__call__`; while `LaunchSites` is open, both wrap a launch made from the user's code in
a `site:` range of that line. Launches of torch's own Triton code (Inductor's generated kernels, a torch operator's)
are left alone: their lines come from Inductor's graphs, or from the torch call around them.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import FrameType
from typing import Any

from mcp_server.children.contract import SITE_RANGE_PREFIX
from mcp_server.children.sites import UserFrames, site_ranges


class LaunchSites:
    """While open, each Triton launch (Triton imported) and NVRTC kernel launch from the user's code runs inside a
    `site:` range."""

    def __init__(self, profiler: str, frames: UserFrames) -> None:
        self.frames = frames
        self._open_range, self._close_range = site_ranges(profiler)
        self._local = threading.local()
        self._installed: tuple[Any, Any, Any, Any] | None = None  # (where, previous enter, previous exit, style)
        self._nvrtc: tuple[Any, Any] | None = None  # (`_CudaKernel`, its `__call__` as it was)

    def site(self, frame: FrameType | None) -> str | None:
        """`path:line` of the innermost user frame from `frame` outwards, passing a library's frames (Triton's own
        launcher); None when torch's own code (Inductor's, a torch operator's) or no user frame made the launch."""
        while frame is not None:
            code = frame.f_code
            if self.frames.is_user(code):
                return f"{code.co_filename}:{frame.f_lineno}"
            if not self.frames.is_library(code) and not code.co_filename.startswith("<"):
                return None
            frame = frame.f_back
        return None

    def enter(self, metadata: Any = None) -> None:
        """Triton's launch-enter hook: open the launch's range (None kept when no user line made it)."""
        self._open(sys._getframe(1))

    def _open(self, frame: FrameType | None) -> None:
        stack: list[Any] = self._stack()
        site = self.site(frame)
        stack.append(self._open_range(SITE_RANGE_PREFIX + site) if site is not None else None)

    def exit(self, metadata: Any = None) -> None:
        """Triton's launch-exit hook: close the range its enter opened."""
        stack: list[Any] = self._stack()
        if stack:
            handle = stack.pop()
            if handle is not None:
                self._close_range(handle)

    def _stack(self) -> list[Any]:
        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def __enter__(self) -> LaunchSites:
        self._wrap_nvrtc()
        triton = sys.modules.get("triton")
        if triton is None:  # the workload launches no Triton kernel of its own: nothing to hook (not imported for it)
            return self
        knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
        if knobs is not None and hasattr(knobs.launch_enter_hook, "add"):  # Triton >= 3.5: chains of hooks
            knobs.launch_enter_hook.add(self.enter)
            knobs.launch_exit_hook.add(self.exit)
            self._installed = (knobs, None, None, "chain")
            return self
        where = knobs
        if where is None:  # Triton < 3.4: the hooks are CompiledKernel's class attributes
            where = getattr(getattr(triton, "compiler", None), "CompiledKernel", None)
        if where is None or not hasattr(where, "launch_enter_hook"):
            return self
        previous = (where.launch_enter_hook, where.launch_exit_hook)
        where.launch_enter_hook = _chained(previous[0], self.enter)
        where.launch_exit_hook = _chained(self.exit, previous[1])
        self._installed = (where, *previous, "attribute")
        return self

    def _wrap_nvrtc(self) -> None:
        from torch.cuda import _utils

        kernel = getattr(_utils, "_CudaKernel", None)
        if kernel is None or self._nvrtc is not None:
            return
        original = kernel.__call__
        sites = self

        def call(launched: Any, *args: Any, **kwargs: Any) -> Any:
            sites._open(sys._getframe(1))
            try:
                return original(launched, *args, **kwargs)
            finally:
                sites.exit()

        kernel.__call__ = functools.wraps(original)(call)
        self._nvrtc = (kernel, original)

    def __exit__(self, *exc: object) -> None:
        if self._nvrtc is not None:
            kernel, original = self._nvrtc
            kernel.__call__ = original
            self._nvrtc = None
        if self._installed is None:
            return
        where, enter, exit_, style = self._installed
        self._installed = None
        if style == "chain":
            where.launch_enter_hook.remove(self.enter)
            where.launch_exit_hook.remove(self.exit)
        else:
            where.launch_enter_hook, where.launch_exit_hook = enter, exit_


def _chained(first: Any, second: Any) -> Any:
    """Call `first` then `second` (either may be None: the other alone)."""
    if first is None or second is None:
        return second if first is None else first

    def both(metadata: Any) -> None:
        first(metadata)
        second(metadata)

    return both
