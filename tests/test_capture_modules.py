"""A CUDA graph the workload captures inside its own forward is recorded with module ranges: the module hooks are
installed at the capture's start, after the calls around it began. The modules called then keep the paths the
window gives them (under the model whose forward is running). Outside eager mode the hooks are the model's modules'
own, not global: a compiled region entered during the capture must run as compiled (Dynamo skips its guards on empty
per-module hook dicts by default, but guards on the global ones when it compiles a whole module)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import REPO
from torch import nn

from mcp_server.children.global_modules import GlobalModules
from mcp_server.children.graph_capture import _hookable
from mcp_server.children.sites import UserFrames


class Encoder(nn.Module):
    """A forward that installs the hooks half-way, as `GraphCaptureRanges` does at a capture inside it."""

    def __init__(self, per_module: bool = False) -> None:
        super().__init__()
        self.per_module = per_module
        self.embed = nn.Linear(4, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.seen: list[str] = []
        self.capturing = True

    def forward(self, x):
        x = self.embed(x)
        if not self.capturing:
            return self.head(self.body(x))
        modules = GlobalModules("none")
        modules.listeners.append(lambda module, path, started, args: started and self.seen.append(path))
        modules.install(_hookable([self]) if self.per_module else None)
        try:
            return self.head(self.body(x))
        finally:
            modules.remove()


def test_modules_called_after_the_hooks_arrive_keep_their_paths_under_the_running_model():
    model = Encoder()
    model(torch.ones(1, 4))
    assert model.seen == ["body", "body.0", "body.1", "head"]


def test_a_module_called_outside_any_model_is_its_own_root():
    modules = GlobalModules("none")
    seen: list[str] = []
    modules.listeners.append(lambda module, path, started, args: started and seen.append(path))
    modules.install()
    try:
        nn.Sequential(nn.Linear(2, 2))(torch.ones(1, 2))
    finally:
        modules.remove()
    assert seen == ["Sequential", "0"] and modules.roots == ["Sequential"]


@pytest.mark.parametrize("told_user_code", [True, False])
def test_a_second_model_whose_paths_another_holds_is_named_in_full(told_user_code):
    """Two models of one class (a speculative decoder's draft and target), or two with a module of the same name
    (an ensemble's two `head`s): each module keeps a path of its own, the first model's as it was; a second model of
    a class is named by the user's variable for it, and numbered without one."""

    class Tower(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.trunk, self.head = nn.Linear(2, width), nn.Linear(width, 2)

        def forward(self, x):
            return self.head(self.trunk(x))

    modules = GlobalModules("none")
    modules.frames = UserFrames() if told_user_code else None
    seen: list[str] = []
    modules.listeners.append(lambda module, path, started, args: started and seen.append(path))
    target, draft, other, loss = Tower(4), Tower(2), nn.Sequential(nn.Linear(2, 2)), nn.MSELoss()
    modules.install()
    try:
        x = torch.ones(1, 2)
        for model in (target, draft, other, target):
            loss(model(x), x)
    finally:
        modules.remove()
    # the second Tower is named by the variable first bound to it here (`draft`, not the loop's `model`)
    second = "draft" if told_user_code else "Tower[1]"
    assert seen == ["Tower", "trunk", "head", "MSELoss", second, f"{second}.trunk", f"{second}.head", "MSELoss",
                    "Sequential", "0", "MSELoss", "Tower", "trunk", "head", "MSELoss"]
    assert modules.roots == ["Tower", "MSELoss", second, "Sequential"]
    assert modules.modules()[f"{second}.head"] == "Linear"


def _no_recompile(model: nn.Module, fn) -> torch.Tensor:
    """`fn`'s output once compiled with no hook installed (the warm-up), then called again while `model` installs its
    hooks half-way (a recompile raises)."""
    import torch._dynamo

    previous = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    try:
        model.capturing = False
        expected = fn(torch.ones(1, 4))
        model.capturing = True
        assert torch.equal(fn(torch.ones(1, 4)), expected)
        return expected
    finally:
        torch._dynamo.config.error_on_recompile = previous
        torch._dynamo.reset()


def test_per_module_hooks_leave_a_compiled_submodule_as_compiled():
    """Hooks added after a submodule's forward compiled neither recompile it nor run inside it; the modules called
    eagerly around it are seen."""
    import torch._dynamo

    torch._dynamo.reset()
    model = Encoder(per_module=True)
    model.body.forward = torch.compile(model.body.forward, backend="eager")
    _no_recompile(model, model)
    assert model.seen == ["body", "head"], "the compiled body's layers are not called eagerly"


def test_per_module_hooks_leave_a_model_compiled_whole_as_compiled():
    """`torch.compile(model)` traces the model's `_call_impl`, which reads the global hook dicts (torch 2.11 guards
    on them there): hooks of the modules' own, added after it compiled, leave it as compiled and run outside it,
    never traced (Dynamo compiles every new frame called in the compiled call's extent)."""
    import torch._dynamo

    torch._dynamo.reset()
    model = Encoder()
    model.capturing = False
    compiled = torch.compile(model, backend="eager")
    expected = compiled(torch.ones(1, 4))  # compiled with no hook installed (the warm-up)
    modules = GlobalModules("none")
    seen: list[str] = []
    modules.listeners.append(lambda module, path, started, args: started and seen.append(path))
    previous = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    modules.install(_hookable([model]))
    try:
        assert torch.equal(compiled(torch.ones(1, 4)), expected)  # a recompile would raise here
    finally:
        modules.remove()
        torch._dynamo.config.error_on_recompile = previous
        torch._dynamo.reset()
    assert seen == ["Encoder"], "the model's own call runs eagerly around its compiled forward, named as the model"


def test_a_module_with_hooks_of_the_workloads_own_takes_none_of_ours():
    model = Encoder()
    model.head.register_forward_hook(lambda module, args, output: None)
    hooked = _hookable([model])
    assert model.head not in hooked and model.body in hooked and model in hooked
    previous = torch._dynamo.config.skip_nnmodule_hook_guards
    torch._dynamo.config.skip_nnmodule_hook_guards = False
    try:
        assert _hookable([model]) == [], "Dynamo would guard on every hook dict"
    finally:
        torch._dynamo.config.skip_nnmodule_hook_guards = previous


def test_installing_the_hooks_does_not_import_dynamo():
    """A script's pass installs the hooks at its start: importing Dynamo for them would cost it seconds."""
    code = ("import sys, torch\nfrom mcp_server.children.global_modules import GlobalModules\n"
            "modules = GlobalModules('none').install()\ntorch.nn.Linear(2, 2)(torch.ones(1, 2))\n"
            "print('torch._dynamo' in sys.modules, modules.roots)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.split() == ["False", "['Linear']"]


def _replicated(module: nn.Module) -> nn.Module:
    """A copy of `module` as `nn.parallel.replicate` makes one for another GPU (each module copied, `_is_replica`
    set, the children rewired to the copies): replicate itself needs CUDA devices."""
    copies = {m: m._replicate_for_data_parallel() for m in module.modules()}
    for original, copy in copies.items():
        copy._modules = {name: copies[child] for name, child in original._modules.items()}
        for name, param in original._parameters.items():  # replicate sets the broadcast copies as attributes
            setattr(copy, name, param.detach())
    return copies[module]


def test_a_dataparallel_replica_run_on_its_own_thread_takes_the_paths_of_the_module_it_copies():
    """DataParallel replicates the model at every forward and runs each replica on a thread of its own, where no call
    is above it: it would have been a new root, numbered anew at each step (`Sequential[1]`, `Sequential[2]`...)."""
    import gc
    import threading

    modules = GlobalModules("none")
    seen: list[str] = []
    modules.listeners.append(lambda module, path, started, args: started and seen.append(path))
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 2))
    wrapper = nn.DataParallel(net)  # no GPU: it calls the model as it is
    modules.install()
    try:
        wrapper(torch.ones(1, 2))
        for _ in range(2):  # two steps, a new replica each
            replica = _replicated(net)
            thread = threading.Thread(target=replica, args=(torch.ones(1, 2),))
            thread.start()
            thread.join()
            del replica
            gc.collect()
    finally:
        modules.remove()
    assert seen == ["DataParallel", "module", "module.0", "module.1", "module.2"] + ["module", "module.0", "module.1",
                                                                                     "module.2"] * 2
    assert modules.roots == ["DataParallel"]
    assert len(modules._paths) == 1  # the replicas' entries went with them
