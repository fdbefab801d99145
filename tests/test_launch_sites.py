"""A Triton kernel, or an NVRTC-compiled one, that the workload launches itself has no torch call around it: Triton's
own launch hooks, and a wrapper of `torch.cuda._utils._CudaKernel.__call__`, put it inside a `site:` range of the
user's line while a window is open (`children.launch_sites`). Neither launches anything on a CPU, so these tests call
the hooks as Triton's launcher does, through Triton's own hook objects, and an NVRTC kernel's launch up to the driver
call that fails here; the H200 recordings of a script whose RMSNorm is two `@triton.jit` kernels and of one with NVRTC
kernels check the same live (`tests/test_direct_launches.py`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from mcp_server.children.launch_sites import LaunchSites
from mcp_server.children.sites import UserFrames

triton = pytest.importorskip("triton")


def _launch() -> None:
    """One launch as Triton's launcher makes it: its enter hook, the kernel (a torch call stands for it), its exit
    hook."""
    runtime = _runtime()
    runtime.launch_enter_hook(None)
    torch.ones(4).add_(1)
    runtime.launch_exit_hook(None)


def _runtime():
    knobs = getattr(triton, "knobs", None)
    return knobs.runtime if knobs is not None else triton.compiler.CompiledKernel


def _line(text: str) -> str:
    number = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)
    return f"{__file__}:{number}"


def test_a_launch_from_the_users_code_runs_inside_a_range_of_its_line():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with LaunchSites("torch", UserFrames()):
            _launch()
        _launch()  # the window closed: the hooks are gone
    sites = [e.name for e in prof.events() if e.name.startswith("site:")]
    assert sites == ["site:" + _line("runtime.launch_enter_hook(None)")]


def test_the_hooks_of_others_keep_running_and_stay_after_the_window():
    runtime, calls = _runtime(), []

    def theirs(metadata: object) -> None:
        calls.append(metadata)

    chain = hasattr(runtime.launch_enter_hook, "add")
    previous = None if chain else runtime.launch_enter_hook
    if chain:
        runtime.launch_enter_hook.add(theirs)
    else:
        runtime.launch_enter_hook = theirs
    try:
        with LaunchSites("torch", UserFrames()):
            _launch()
        _launch()
        assert len(calls) == 2
    finally:
        if chain:
            runtime.launch_enter_hook.remove(theirs)
        else:
            runtime.launch_enter_hook = previous


def test_no_range_for_a_launch_torch_itself_makes():
    """Inductor's generated code, or a torch operator's Triton kernel: no user frame made it before torch's did."""
    launches = LaunchSites("torch", UserFrames())
    torch_frame = [None]

    def inside_torch(*_: object) -> None:  # called from torch's own code: its frame is the caller's
        torch_frame[0] = sys._getframe(1)

    torch.utils._pytree.tree_map(inside_torch, [1])
    assert launches.site(torch_frame[0]) is None
    assert launches.site(sys._getframe()) == f"{__file__}:{sys._getframe().f_lineno}"


def test_an_nvrtc_kernels_launch_from_the_users_code_runs_inside_a_range_of_its_line():
    """`_CudaKernel.__call__` as `torch.cuda._compile_kernel` returns it; on this CPU machine its driver call fails,
    and the range is closed all the same."""
    from torch.cuda._utils import _CudaKernel

    kernel = _CudaKernel(None, None)
    original = _CudaKernel.__call__
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        # no driver here: OSError or RuntimeError, by torch version
        with LaunchSites("torch", UserFrames()), pytest.raises(Exception):  # noqa: B017
            kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[])  # the NVRTC launch's line
        with pytest.raises(Exception):  # noqa: B017
            kernel(grid=(1, 1, 1), block=(32, 1, 1), args=[])
    sites = [e.name for e in prof.events() if e.name.startswith("site:")]
    assert sites == ["site:" + _line("args=[])  # the NVRTC launch's line")]
    assert _CudaKernel.__call__ is original
