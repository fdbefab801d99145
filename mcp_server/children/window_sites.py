"""Every line a window's work comes from (standard library and torch only): the call-site mode on the thread that
opens it (with the nodes of the FX programs it runs), the thread capture for the threads the workload starts and for
autograd's (the gradient hooks it registers among them), and Triton's launch hooks for the kernels it launches
itself; recorded while `active`."""

from __future__ import annotations

from typing import Any

from mcp_server.children.fx_graphs import FxNodes, PathOf
from mcp_server.children.launch_sites import LaunchSites
from mcp_server.children.sites import GradientHooks, ThreadCapture, UserFrames, call_sites


class WindowSites:
    """The call-site mode, the thread capture and Triton's launch hooks as one: entered for a window (the workload
    contract), or for a whole script and switched on in its windows (`active`: a compiled frame sees one mode stack
    throughout, and Triton's hooks are installed once the script has imported Triton)."""

    def __init__(self, profiler: str, frames: UserFrames, path_of: PathOf, record_shapes: bool = True,
                 active: bool = True) -> None:
        nodes = FxNodes(frames, path_of)
        self.sites = call_sites(profiler, frames, active=active, graph_nodes=nodes)
        self.threads = ThreadCapture(profiler, record_shapes, frames, active=active, graph_nodes=nodes)
        self.launches = LaunchSites(profiler, frames)
        self.hooks = GradientHooks()
        self._active = active

    @property
    def active(self) -> bool:
        """Whether the lines are recorded now."""
        return self._active

    @active.setter
    def active(self, on: bool) -> None:
        if on == self._active:
            return
        self._active = self.sites.active = self.threads.active = on
        if on:
            self.launches.__enter__()
        else:
            self.launches.__exit__()

    def __enter__(self) -> WindowSites:
        self.hooks.install()
        self.threads.__enter__()
        self.sites.__enter__()
        if self._active:
            self.launches.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            self.launches.__exit__()
        self.sites.__exit__(*exc)
        self.threads.__exit__(*exc)
        self.hooks.remove()
