"""What the memory pass's harness records beside the allocator, on a real training step on the CPU: every aten call
with its module (forward and backward), phase, line, autograd node and outputs; the optimizer's and backward's
spans; the tensors' identities. (The allocator's history itself needs CUDA: the GPU recording covers it.)"""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from mcp_server.children.memory import MemoryCapture, out_of_memory
from mcp_server.children.memory_tracking import ModuleStack, Spans, Strings, identities, op_recorder, storage_of
from mcp_server.children.sites import UserFrames


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block(), nn.Linear(8, 2))


def _recorded_step() -> tuple[list[tuple], Strings, Spans, nn.Module, torch.optim.Optimizer, torch.Tensor, list]:
    model, x = _model(), torch.randn(4, 8)
    optimizer = torch.optim.AdamW(model.parameters())
    strings, stepping = Strings(), Spans()
    hooks = [register_optimizer_step_pre_hook(lambda *_: stepping.begin()),
             register_optimizer_step_post_hook(lambda *_: stepping.end())]
    modules = ModuleStack(model, "Sequential").install()
    recorder = op_recorder(strings, modules, stepping, UserFrames())
    outputs = []
    try:
        with recorder:
            out = model(x)
            outputs.append(storage_of(out))
            out.square().mean().backward()
            optimizer.step()
    finally:
        modules.remove()
        for hook in hooks:
            hook.remove()

    def name(i: int) -> str | None:
        return strings.names[i] if i >= 0 else None

    calls = [(name(c[0]), name(c[4]), name(c[5]), name(c[6]), name(c[7]), c[1], c[2], c[8]) for c in recorder.calls]
    return calls, strings, stepping, model, optimizer, x, outputs


def test_every_call_is_recorded_with_its_module_phase_line_and_outputs():
    calls, strings, stepping, *_, outputs = _recorded_step()
    forward = [c for c in calls if c[2] == "forward"]
    assert [(c[0], c[1]) for c in forward if c[0] in ("aten::addmm", "aten::relu")] == [
        ("aten::addmm", "0.fc"), ("aten::relu", "0.act"), ("aten::addmm", "1.fc"), ("aten::relu", "1.act"),
        ("aten::addmm", "2")]
    assert all(c[3] is not None and c[3].startswith(__file__ + ":") for c in forward)
    assert all(c[5] <= c[6] for c in calls)  # start before end, in time.time_ns()
    last = next(c for c in forward if c[0] == "aten::addmm" and c[1] == "2")
    assert last[7][0][0] == outputs[0][0] and strings.names[last[7][0][2]] == "float32"


def test_backward_work_is_inside_the_module_it_differentiates():
    calls, *_ = _recorded_step()
    backward = [c for c in calls if c[2] == "backward"]
    assert backward and all(c[3] is None for c in backward)  # the engine's threads run no user code
    by_node = {(c[4], c[1]) for c in backward}
    assert ("AddmmBackward0", "2") in by_node and ("ReluBackward0", "1.act") in by_node
    assert ("AddmmBackward0", "0.fc") in by_node and ("torch::autograd::AccumulateGrad", "0.fc") in by_node
    assert ("AddmmBackward0", "Sequential") not in by_node  # a node belongs to the innermost module that made it


def test_the_optimizer_step_is_its_own_phase_and_span():
    calls, _, stepping, *_ = _recorded_step()
    inside = [c for c in calls if c[2] == "optimizer"]
    assert inside and len(stepping.spans) == 1
    start, end = stepping.spans[0]
    assert all(start <= c[5] and c[6] <= end for c in inside)
    assert not any(c[0].startswith("profiler::") for c in calls)  # torch.optim's record_function markers


def test_the_identities_name_parameters_gradients_optimizer_state_and_inputs():
    _, strings, _, model, optimizer, x, _ = _recorded_step()
    rows = identities(model, (x,), "Sequential", strings, device_type="cpu")
    named = {strings.names[r[4]]: (strings.names[r[2]], strings.names[r[3]] if r[3] >= 0 else None, r[0], r[1])
             for r in rows}
    weight = model[0].fc.weight
    assert named["0.fc.weight"] == ("parameter", "0.fc", weight.data_ptr(), weight.untyped_storage().nbytes())
    assert named["0.fc.weight.grad"][:3] == ("gradient", "0.fc", weight.grad.data_ptr())
    exp_avg = optimizer.state[weight]["exp_avg"]
    assert named["0.fc.weight.exp_avg"][:3] == ("optimizer_state", "0.fc", exp_avg.data_ptr())
    assert named["2.bias.exp_avg_sq"][:2] == ("optimizer_state", "2")
    assert named["input[0]"][:2] == ("input_output", None)
    assert identities(model, (x,), "Sequential", Strings()) == []  # only the device asked for


def test_the_phases_are_recorded_through_torch_autograd_and_torch_optim(tmp_path):
    capture = MemoryCapture(tmp_path, {"phase": "measure", "artifacts": []})
    original = torch.autograd.backward
    capture._phases(torch)
    try:
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
    finally:
        for restore in capture._restore:
            restore()
    assert torch.autograd.backward is original
    assert len(capture.backward.spans) == 1 and len(capture.optimizer.spans) == 1
    assert capture.backward.spans[0][1] <= capture.optimizer.spans[0][0]


def test_out_of_memory_is_torch_s_error_only():
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not out_of_memory(RuntimeError("CUDA out of memory"))


def test_a_call_outside_every_module_records_what_it_reads():
    model, x = _model(), torch.randn(4, 8)
    strings = Strings()
    modules = ModuleStack(model, "Sequential").install()
    recorder = op_recorder(strings, modules, Spans(), UserFrames())
    try:
        with recorder:
            out = model(x)
            nn.functional.cross_entropy(out, torch.tensor([0, 1, 0, 1]))
    finally:
        modules.remove()
    loss = next(c for c in recorder.calls if strings.names[c[0]] == "aten::_log_softmax")
    assert loss[4] == -1 and loss[9][0] == out.untyped_storage().data_ptr()
    inside = next(c for c in recorder.calls if strings.names[c[0]] == "aten::addmm")
    assert inside[9] == []  # a call inside a module needs no inputs: its module is known


def test_a_closure_the_optimizers_step_runs_is_left_out_of_the_steps_span(tmp_path):
    capture = MemoryCapture(tmp_path, {"phase": "measure", "artifacts": []})
    capture._phases(torch)
    try:
        model = _model()
        optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
        x = torch.randn(2, 8)

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss

        optimizer.step(closure)
    finally:
        for restore in capture._restore:
            restore()
    backward, stepping = capture.backward.spans, capture.optimizer.spans
    assert len(backward) >= 2  # L-BFGS called the closure more than once
    # the step's span is split around each call of the closure: no backward inside it
    assert not [b for b in backward for s in stepping if s[0] <= b[0] and b[1] <= s[1]]
    assert stepping[0][1] <= backward[0][0] and backward[-1][1] <= stepping[-1][0]
