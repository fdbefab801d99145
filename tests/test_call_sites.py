"""Which line a torch call is attributed to: the user's innermost frame, or, when the model is a library's (a Hugging
Face model the harness calls, no user frame on the stack), that library's innermost frame; never torch's, the
standard library's or this package's. Real frames and FX stack traces, no GPU."""

from __future__ import annotations

import _thread
import os
import sys
import sysconfig
import threading
from pathlib import Path

import torch

from mcp_server.children.naming import user_site
from mcp_server.children.sites import ThreadCapture, UserFrames, is_core, library_roots

LIBRARY = os.path.join(sysconfig.get_paths()["purelib"], "somelib", "modeling.py")  # a third-party model's file
SOURCE = """
import sys

def forward(captured):
    captured.append(sys._getframe(0))  # line 5: the library's own line that makes the torch call

def run(captured):
    forward(captured)  # line 8
"""


def _library() -> dict:
    scope: dict = {}
    exec(compile(SOURCE, LIBRARY, "exec"), scope)  # noqa: S102 - code whose frames carry the library's path
    return scope


def test_a_library_model_without_user_frames_takes_the_librarys_innermost_line():
    captured: list = []
    worker = threading.Thread(target=_library()["run"], args=(captured,))  # outer frames: threading's only
    worker.start()
    worker.join()
    frames = UserFrames()
    assert frames.site(captured[0]) == f"{LIBRARY}:5"
    assert frames.is_library(captured[0].f_code) and not frames.is_user(captured[0].f_code)


def test_the_users_line_comes_before_any_librarys():
    captured: list = []
    _library()["run"](captured)  # called from this test: a user frame outside the library's
    site = UserFrames().site(captured[0])  # this frame is still running: its line is this one
    assert site == f"{__file__}:{sys._getframe(0).f_lineno - 1}"


def test_torch_the_standard_library_and_this_package_are_never_a_site():
    assert is_core(os.path.realpath(torch.nn.Linear.forward.__code__.co_filename))
    assert is_core(os.path.realpath(threading.__file__))
    assert not is_core(os.path.realpath(LIBRARY)) and os.path.realpath(LIBRARY).startswith(library_roots())
    frames = UserFrames()
    assert not frames.is_library(torch.nn.Linear.forward.__code__)
    assert not frames.is_library(threading.Thread.run.__code__)


def test_an_fx_nodes_stack_trace_falls_back_to_the_library_line_too():
    torch_file = torch.nn.Linear.forward.__code__.co_filename
    library_only = (f'  File "{LIBRARY}", line 8, in run\n  File "{LIBRARY}", line 5, in forward\n'
                    f'  File "{torch_file}", line 125, in forward\n')
    assert user_site(library_only, library_roots()) == f"{LIBRARY}:5"
    with_user = f'  File "{__file__}", line 3, in step\n' + library_only
    assert user_site(with_user, library_roots()) == f"{__file__}:3"
    assert user_site(f'  File "{torch_file}", line 125, in forward\n', library_roots()) is None



class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad  # the custom backward's own line


def test_a_custom_functions_backward_on_a_thread_without_the_mode_takes_its_line():
    """A GPU's backward runs on autograd's device thread, a C++ thread with the profiler's state but no torch function
    mode; here a thread started without `threading` stands for it (a CPU's backward runs on the caller's thread)."""
    from torch.autograd.profiler import _ExperimentalConfig

    config = _ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], experimental_config=config) as prof, \
            ThreadCapture("torch", True, UserFrames()):
        x = torch.ones(3, requires_grad=True)
        y = _Square.apply(x).sum()
        done = threading.Event()

        def run():
            y.backward()
            done.set()

        _thread.start_new_thread(run, ())
        assert done.wait(30)
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "the custom backward's own line" in text)
    assert [e.name for e in prof.events() if e.name.startswith("site:")] == [f"site:{__file__}:{line}"] * 2
    assert torch.autograd.function.BackwardCFunction.apply.__module__ == "torch.autograd.function"  # restored
