"""Training scripts profiled as they are by the real CLI and harness under torch.profiler on this CPU. One with two
models and an optimizer each (a GAN's loop): a step is one iteration of the loop, ended by its last optimizer, and
each update's work belongs to the innermost module holding the parameters it updates. One that accumulates and clips
its gradients: each step's clipping is the update's. One whose model writes into slices of a buffer: the backward of
each write is the module's that wrote it. One that evaluates its model inside the loop: a window holding the
evaluation says so. One trained by L-BFGS, whose step runs the closure's forward and backward: they keep their
phases."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import REPO
from test_script_mode import run_cli

from mcp_server.schema.io import load_profile

SCRIPT = REPO / "tests" / "scripts" / "two_optimizer_train.py"


def _profile(tmp_path, *args: str):
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPT), "-o", str(out), "-q", *args)
    assert proc.returncode == 0, proc.stderr
    return load_profile(out / "profile.json"), json.loads((out / "torch" / "harness.json").read_text())


def test_a_step_is_the_loops_iteration_and_each_update_is_its_models(tmp_path):
    # the generator's first step moves the boundary there, ending the first iteration; the window opens as the
    # second iteration's generator step returns
    profile, harness = _profile(tmp_path, "--steps", "2:1")
    assert harness["steps"]["name"] == "Adam.step" and harness["steps"]["stopped_after_window"]
    ops = profile.operators
    # the window is one whole iteration: the critic's update, then the generator's forward, backward and update
    updates = Counter((op.module_path, op.operator_name) for op in ops if op.phase == "optimizer")
    # the critic's parameters are all its `body`'s (named in full: the generator has a `body` too); the
    # generator's, its `body`'s as well, under the first root's paths
    assert updates[("Critic.body", "aten::add_")] == 4  # SGD: one add_ per parameter
    assert updates[("body", "aten::sqrt")] == 4  # Adam: one sqrt per parameter
    assert {module for module, _ in updates} == {"Critic.body", "body"}
    # the generator's forward ran in the window twice (the critic's fake batch, then its own loss), so its backward
    # nodes find their modules
    backward = {op.module_path for op in ops if op.phase == "backward" and op.operator_name == "aten::mm"}
    assert {"body.0", "body.2"} <= backward  # the generator's, the first root called
    assert not [w for w in profile.warnings if "first stepped after" in w]


def test_an_optimizer_first_stepping_after_the_window_opened_is_warned_of(tmp_path):
    profile, harness = _profile(tmp_path, "--steps", "2:2", "--", "--generator-from", "2")
    assert harness["steps"]["name"] == "SGD.step"
    assert any("Adam first stepped after the window opened" in w for w in profile.warnings)


def test_a_critic_stepped_several_times_before_its_generator_ends_no_step(tmp_path):
    # the warm-up passes the generator's first step (after three critic steps), which moves the boundary there
    profile, harness = _profile(tmp_path, "--steps", "4:1", "--", "--critic-steps", "3")
    assert harness["steps"]["name"] == "Adam.step"
    updates = Counter(op.module_path for op in profile.operators
                      if op.phase == "optimizer" and op.operator_name == "aten::add_")
    assert updates["Critic.body"] == 3 * 4  # three critic steps in the one iteration measured


def test_the_second_backward_of_a_gradient_penalty_is_its_modules(tmp_path):
    profile, _ = _profile(tmp_path, "--steps", "2:1", "--", "--gradient-penalty")
    # the critic's backward through the penalty differentiates the operators its first backward ran
    second = [op for op in profile.operators if (op.autograd_node or "").endswith("BackwardBackward0")]
    assert {op.autograd_node for op in second} >= {"ThresholdBackwardBackward0"}
    assert {(op.autograd_node, op.forward_op) for op in second} >= {
        ("ThresholdBackwardBackward0", "aten::threshold_backward")}
    # the critic's `body` is named in full: the generator, the first root called, has a `body` too
    assert {op.module_path for op in second} == {"Critic.body.1"}


@pytest.mark.parametrize("zero_first", [False, True])
def test_every_steps_clipping_is_the_update_and_the_next_micro_batchs_loading_is_not(tmp_path, zero_first: bool):
    # zero_first: the optimizer's zero_grad() runs after the next step's loading, which stays the forward's
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(REPO / "tests" / "scripts" / "clipped_accum_train.py"), "-o", str(out),
                   "-q", "--steps", "2:3", "--", "--accum", "2", *(["--zero-first"] if zero_first else []))
    assert proc.returncode == 0, proc.stderr
    phases = Counter((op.operator_name, op.phase) for op in load_profile(out / "profile.json").operators
                     if op.module_path is None)
    # each of the three steps clips its gradients between its last backward and its step: the norm's stack and
    # clamp are the update's in the first two steps as in the last
    assert phases[("aten::clamp", "optimizer")] == 3 and phases[("aten::clamp", "forward")] == 0
    assert phases[("aten::stack", "optimizer")] == 3
    # the micro-batches' loading, after a backward or a step and before the model runs, stays the forward's
    assert phases[("aten::stack", "forward")] == 2 * 3


def test_the_backward_of_a_write_into_a_slice_is_the_writes(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(REPO / "tests" / "scripts" / "slice_assign_train.py"), "-o", str(out),
                   "-q", "--steps", "2:1")
    assert proc.returncode == 0, proc.stderr
    writes = [op for op in load_profile(out / "profile.json").operators if op.autograd_node
              and op.autograd_node.endswith("CopySlices")]
    # autograd numbers a CopySlices node after the in-place copy_'s own: it differentiates that copy_, written at
    # the lines of `out[:, :4] = ...` and `out[:, 4:] = ...` in the model's forward
    assert len(writes) == 2 and {op.forward_op for op in writes} == {"aten::copy_"}
    assert {op.module_path for op in writes} == {"Branches"}
    assert sorted(op.call_site.rsplit(":", 1)[1] for op in writes if op.call_site) == ["19", "20"]


def test_an_evaluation_inside_the_window_is_warned_of_and_a_window_between_evaluations_is_not(tmp_path):
    script = str(REPO / "tests" / "scripts" / "eval_in_loop_train.py")
    warned = []
    for steps in ("3:1", "1:1"):  # the evaluation after the third step falls in the fourth step's window
        out = tmp_path / steps.replace(":", "_")
        proc = run_cli("profile", "--script", script, "-o", str(out), "-q", "--steps", steps)
        assert proc.returncode == 0, proc.stderr
        warned.append([w for w in load_profile(out / "profile.json").warnings if "without autograd" in w])
    assert len(warned[0]) == 1 and "(1 of Sequential's calls)" in warned[0][0] and "--steps W:A" in warned[0][0]
    assert warned[1] == []


def test_rows_repeated_by_a_number_need_no_static_shapes_first_and_by_counts_do(tmp_path):
    """A CUDA graph needs static shapes: `repeat_interleave(4)` has them (its repeats have no shape in the profile),
    `repeat_interleave(counts)` reads its output's size from the data."""
    from mcp_server.analysis.syncs import prerequisites

    needs = {}
    for flags in ((), ("--counts",)):
        out = tmp_path / ("counts" if flags else "number")
        proc = run_cli("profile", "--script", str(REPO / "tests" / "scripts" / "repeat_beams.py"), "-o", str(out),
                       "-q", "--window-fn", "expand", "--steps", "2:2", "--", *flags)
        assert proc.returncode == 0, proc.stderr
        profile = load_profile(out / "profile.json")
        assert any(op.operator_name == "aten::repeat_interleave" for op in profile.operators)
        needs[out.name] = prerequisites(profile, None)
    assert not any("make the shapes static" in n for n in needs["number"])
    assert any(n.startswith("make the shapes static (aten::repeat_interleave") for n in needs["counts"])


def test_batches_of_other_shapes_each_step_ask_for_static_shapes_before_a_cuda_graph(tmp_path):
    """A CUDA graph replays the shapes it captured: a model fed a new shape every step needs them padded or bucketed
    first, and so does a generate loop given prompts of new lengths (each call's set of shapes is another); one fed
    the same shapes every step does not."""
    from mcp_server.analysis.syncs import prerequisites

    found = {}
    for name, script, flags in (("ragged", "ragged_batches_train.py", ("--steps", "2:3")),
                                ("fixed", "ragged_batches_train.py", ("--steps", "2:3", "--", "--fixed")),
                                ("generate", "plain_generate.py", ("--window-fn", "generate", "--steps", "1:2"))):
        out = tmp_path / name
        proc = run_cli("profile", "--script", str(REPO / "tests" / "scripts" / script), "-o", str(out), "-q", *flags)
        assert proc.returncode == 0, proc.stderr
        profile = load_profile(out / "profile.json")
        found[name] = (profile.capture_metadata.varying_inputs,
                       [n for n in prerequisites(profile, None) if "inputs' shapes" in n])
    assert found["ragged"][0] == {"Pooled": 3}  # lengths 6, 7, 4 in the three measured steps
    assert found["ragged"][1] == ["make the inputs' shapes static (Pooled's took 3 shapes in the measured windows) — "
                                  "pad or bucket them to a few fixed sizes: a CUDA graph replays the shapes it "
                                  "captured (mode='reduce-overhead' records a graph for each new shape)"]
    assert found["fixed"] == (None, [])
    # prompts of 4 and 5 tokens, each grown by 4 without a cache: (2, 4) to (2, 8)
    assert found["generate"][0] == {"TinyLM": 5} and len(found["generate"][1]) == 1


def test_a_closure_the_optimizers_step_runs_keeps_its_forward_and_backward(tmp_path):
    # L-BFGS runs the closure inside its step(): the model's calls, the loss and the seeds of autograd.grad are the
    # forward's, the nodes the backward's, and only the optimizer's own arithmetic is the update's
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(REPO / "tests" / "scripts" / "lbfgs_pinn_train.py"), "-o", str(out),
                   "-q", "--steps", "1:1")
    assert proc.returncode == 0, proc.stderr
    ops = load_profile(out / "profile.json").operators
    phases = Counter((op.phase, op.operator_name) for op in ops)
    assert phases[("forward", "aten::linear")] == 2 * 2  # two layers, the closure run twice in the step
    assert phases[("forward", "aten::pow")] == 2 and phases[("forward", "aten::mean")] == 2
    assert not [op for op in ops if op.phase == "optimizer" and op.operator_name in ("aten::linear", "aten::tanh")]
    script = REPO / "tests" / "scripts" / "lbfgs_pinn_train.py"
    step_line = next(i for i, text in enumerate(script.read_text().splitlines(), 1) if "opt.step(closure)" in text)
    # the step's own arithmetic, at `opt.step(closure)`
    assert {op.call_site for op in ops if op.phase == "optimizer" and op.call_site} == {f"{script}:{step_line}"}
    assert phases[("optimizer", "aten::dot")] > 0
    # every backward node in the model is tied to its module, the third-order ones (the loss's backward through
    # the second derivative's graph) too
    backward = [op for op in ops if op.phase == "backward" and op.operator_name != "aten::ones_like"]
    assert backward and all(op.forward_op for op in backward)
    third = [op for op in backward if (op.autograd_node or "").endswith("BackwardBackward0")
             and op.forward_op == "aten::tanh_backward"]
    assert third and {op.module_path for op in third} == {"1"}
