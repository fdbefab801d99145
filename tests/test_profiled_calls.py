"""The shape-variant pass's harness turns profiling on only during the module calls its plan names: call numbers
count each module's calls from the start of the window, nested chosen calls open one profiling span."""

from __future__ import annotations

import torch
from torch import nn

from mcp_server.children.window import ProfiledCalls


class Shared(nn.Module):
    """One block called three times per forward, a head called once."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return self.head(x)


def _spans(calls: list[tuple[str, int]], forwards: int = 1) -> list[tuple[str, ...]]:
    """What ran while profiling was on: the modules entered inside each span (a span per start/stop)."""
    model = Shared()
    spans: list[list[str]] = []
    state = {"on": False}

    def switch(on: bool) -> None:
        assert on != state["on"], "profiling switched twice the same way"
        state["on"] = on
        if on:
            spans.append([])

    scoped = ProfiledCalls(model, "Shared", calls, switch)  # its hooks first: a module's own work runs after them
    model.block[0].register_forward_pre_hook(lambda m, a: spans[-1].append("block.0") if state["on"] else None)
    model.head.register_forward_pre_hook(lambda m, a: spans[-1].append("head") if state["on"] else None)
    for _ in range(forwards):
        model(torch.randn(2, 4))
    scoped.remove()
    assert not state["on"]
    return [tuple(s) for s in spans]


def test_only_the_chosen_calls_are_profiled():
    assert _spans([("block", 1)]) == [("block.0",)]
    assert _spans([("block", 0), ("block", 2), ("head", 0)]) == [("block.0",), ("block.0",), ("head",)]


def test_call_numbers_run_on_across_forwards():
    assert _spans([("block", 4)], forwards=2) == [("block.0",)]  # the second forward's second block call


def test_a_chosen_call_inside_a_chosen_call_opens_one_span():
    assert _spans([("Shared", 0), ("block", 1)]) == [("block.0", "block.0", "block.0", "head")]


def test_removed_hooks_profile_nothing():
    model = Shared()
    switched: list[bool] = []
    ProfiledCalls(model, "Shared", [("head", 0)], switched.append).remove()
    model(torch.randn(2, 4))
    assert switched == []


def test_a_scripts_warm_up_calls_are_not_profiled_and_numbers_count_from_the_window():
    """A script's module hooks are installed before its warm-up steps, which run the same calls as the window: a
    call number names a call of the window only (the decode loop's variant pass replayed every chosen call twice,
    once in the warm-up step and once in the window, when they counted from the script's start)."""
    from mcp_server.children.global_modules import GlobalModules

    model = Shared()
    switched: list[bool] = []
    entered: list[str] = []
    modules = GlobalModules("none", [("block", 1)], switched.append).install()
    model.head.register_forward_pre_hook(lambda m, a: entered.append("head"))
    try:
        model(torch.ones(1, 4))  # the warm-up step: block calls 0, 1, 2 run before the window
        assert switched == []
        modules.start_counting()  # the window
        model(torch.ones(1, 4))
        assert switched == [True, False]
        modules.stop_counting()  # after the window
        model(torch.ones(1, 4))
        assert switched == [True, False] and modules.started == 1
    finally:
        modules.remove()
