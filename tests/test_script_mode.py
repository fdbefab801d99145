"""Profiling a plain script as it is (`profile --script`): real scripts with argparse, the `__main__` guard and
DataLoader worker processes, run unmodified by the real CLI and harness under torch.profiler on this CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO

from mcp_server.errors import UsageError
from mcp_server.process import child_script
from mcp_server.schema.io import load_profile
from mcp_server.schema.requests import CaptureOptions

SCRIPTS = REPO / "tests" / "scripts"
TRAIN, GENERATE, MANUAL = SCRIPTS / "plain_train.py", SCRIPTS / "plain_generate.py", SCRIPTS / "manual_train.py"
CUSTOM_FUNCTION = SCRIPTS / "custom_function_train.py"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def _line(path: Path, text: str) -> str:
    """`path:line` of the line holding `text`."""
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path}:{number}"


def test_a_function_of_a_script_without_modules_chooses_the_window(tmp_path):
    """No module call to see it by: the function is found as its first call begins."""
    script, out = SCRIPTS / "no_module_loop.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "iterate", "--steps", "2:3", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    assert harness["steps"]["kind"] == "function" and harness["steps"]["defined_at"] == _line(script, "def iterate(")
    products = Counter(op.call_site for op in load_profile(out / "profile.json").operators
                       if op.operator_name == "aten::matmul")
    # three steps, and the read-back between the second and the third (two products at its line)
    assert products == {_line(script, "vector = matrix @ vector"): 3, _line(script, "print(f\"step"): 2}


def test_a_function_named_as_one_of_the_standard_librarys_is_the_scripts(tmp_path):
    """`os.environ` runs an `encode` of its own before the script's decorated `encode` first runs: the steps are
    the script's calls."""
    script, out = SCRIPTS / "encode_serve.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "encode", "--steps", "2:2", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    assert harness["steps"]["kind"] == "function"
    assert harness["steps"]["defined_at"] == _line(script, "@torch.inference_mode()")  # where its code begins
    ops = load_profile(out / "profile.json").operators
    assert Counter(op.module_path for op in ops if op.operator_name == "aten::linear") == {"0": 2, "2": 2}


def test_a_torchscript_models_operators_take_its_name_and_the_line_calling_it(tmp_path):
    """TorchScript's interpreter runs no module hook or call-site range: the model is named by its own class (not
    `RecursiveScriptModule`), its operators by the line that called it, and the profile says why no finer."""
    script, out = SCRIPTS / "scripted_serve.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "serve", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.root_module == "Net"
    inside = [op for op in profile.operators if op.module_path == "Net"]
    assert {op.operator_name for op in inside} >= {"aten::linear", "aten::softmax"}
    assert {op.call_site for op in inside} == {_line(script, "return model(batch)")}
    assert any(w.startswith("Net is TorchScript (torch.jit.script)") for w in profile.warnings)


def test_a_tensors_value_read_by_python_is_named_at_its_line(tmp_path):
    """`if t.any():`, `int(t)` and an f-string of a tensor copy its value to the host (on a GPU, a wait): the
    operators they run take the line that read it."""
    script, out = SCRIPTS / "host_reads.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "step", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    reads = {op.operator_name: op.call_site for op in load_profile(out / "profile.json").operators
             if op.operator_name in ("aten::is_nonzero", "aten::item", "aten::_local_scalar_dense")}
    assert reads["aten::is_nonzero"] == _line(script, "if (y > 2).any():")
    assert {site for name, site in reads.items() if name != "aten::is_nonzero"} <= {
        _line(script, "count = int("), _line(script, 'print(f"positive')}


def test_a_training_script_with_dataloader_workers_is_profiled_as_it_is(tmp_path):
    out = tmp_path / "run"
    # 16 samples in batches of 8: two steps per epoch, so the window (3 warm-up steps, 1 active) and the 5 windows
    # timed without the profiler after it (no CUDA here) need the script's own --epochs 5 after `--`; its
    # DataLoader reads them in 2 worker processes.
    proc = run_cli("profile", "--script", str(TRAIN), "-o", str(out), "-q", "--",
                   "--epochs", "5", "--samples", "16", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    assert harness["workload_kind"] == "steps" and harness["cudnn_benchmark"] is False
    assert harness["steps"] == {**harness["steps"], "kind": "optimizer", "name": "SGD.step", "warmup": 3,
                                "active": 1, "seen": 3 + 1 + 5, "stopped_after_window": True}
    assert len(harness["unprofiled_windows"]) == 5 and all(w["wall_time_ns"] > 0 for w in harness["unprofiled_windows"])
    profile = load_profile(out / "profile.json")
    assert profile.window.unprofiled_windows == 5 and profile.window.unprofiled_wall_time_ns, (
        "a script's step timed without the profiler, as the contract's window is on the CPU")
    meta = profile.capture_metadata
    assert meta.run_mode == "train_step" and meta.root_module == "Classifier"
    assert meta.command_line[-6:] == ["--", "--epochs", "5", "--samples", "16", "--workers", "2"][-6:]
    ops = profile.operators
    assert {op.phase for op in ops} == {"forward", "backward", "optimizer"}
    linears = [op for op in ops if op.operator_name == "aten::linear"]
    assert [op.module_path for op in linears] == ["body.0", "body.2", "head"]
    assert {op.call_site for op in linears} == {_line(TRAIN, "return self.head(self.body(x))")}
    backward = [op for op in ops if op.phase == "backward" and op.operator_name == "aten::mm"]
    assert backward and all(op.forward_op == "aten::linear" for op in backward)
    assert {op.module_path for op in backward} == {"body.0", "body.2", "head"}
    loss = next(op for op in ops if op.operator_name == "aten::cross_entropy_loss")
    assert loss.module_path == "CrossEntropyLoss" and loss.call_site == _line(TRAIN, "loss = loss_fn(")
    steps = [op for op in ops if op.phase == "optimizer"]
    assert len(steps) == 6 and {op.module_path for op in steps} == {"Classifier"}  # SGD: one add_ per parameter
    assert {op.call_site for op in steps} == {_line(TRAIN, "optimizer.step()")}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run_mode"] == "train_step" and len(manifest["passes"]) == 1


def test_an_average_of_the_weights_at_the_windows_start_is_the_update(tmp_path):
    """The window opens as a step returns, so the average the script takes right after each step runs at the start
    of the next window, before its forward: it is the update's work all the same."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(TRAIN), "-o", str(out), "-q", "--", "--epochs", "2", "--samples", "16",
                   "--ema")
    assert proc.returncode == 0, proc.stderr
    ops = load_profile(out / "profile.json").operators
    average = [op for op in ops if op.operator_name == "aten::_foreach_lerp_"]
    first_forward = next(i for i, op in enumerate(ops) if op.phase == "forward" and op.module_path)
    assert average and ops.index(average[0]) < first_forward  # at the window's start
    assert {(op.phase, op.call_site) for op in average} == {("optimizer", _line(TRAIN, "torch._foreach_lerp_("))}
    assert {op.phase for op in ops if op.operator_name == "aten::cross_entropy_loss"} == {"forward"}


def test_a_script_that_compiles_its_model_keeps_its_graphs_as_they_run_without_the_profiler(tmp_path):
    """The window's module hooks and call-site mode are traced away inside torch.compile: no graph break of ours, no
    recompile when the window opens (Dynamo guards on the mode stack), and the graphs the script compiled are
    recorded so that their kernels take modules and lines; the root is the model, not torch.compile's wrapper. (The
    calls the generated code makes took its lines in Inductor's cache as their call sites.)"""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(TRAIN), "-o", str(out), "-q", "--",
                   "--epochs", "2", "--samples", "16", "--compile")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    assert harness["graph_breaks"] == [] and harness["root_module"] == "Classifier"
    provenance = json.loads((out / "torch" / "inductor_provenance.json").read_text())
    assert [g["kind"] for g in provenance["graphs"]] == ["dynamo", "forward", "backward"]  # compiled once
    linears = {n["module_path"] for n in provenance["node_modules"].values() if n.get("module_type") == "Linear"}
    assert linears == {"body.0", "body.2", "head"}
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.root_module == "Classifier"
    assert {op.phase for op in profile.operators} == {"forward", "backward", "optimizer"}
    assert "OptimizedModule" not in {op.module_path for op in profile.operators}
    # the compiled graph's own calls into torch (its extern GEMMs, its buffers) are the line that called the model,
    # or the model's own, not a line of the code Inductor generated in its cache
    sites = {op.call_site for op in profile.operators}
    assert sites and all(site and site.startswith(f"{TRAIN}:") for site in sites), sites


def test_an_inference_script_is_windowed_by_calls_of_a_named_function_or_module(tmp_path):
    out = tmp_path / "fn"
    proc = run_cli("profile", "--script", str(GENERATE), "--window-fn", "generate", "--steps", "1:1", "-o", str(out),
                   "-q", "--", "--prompts", "3", "--new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    # generate's second call is the window; its third, the script's last, is timed without the profiler
    assert harness["steps"]["kind"] == "function" and harness["steps"]["seen"] == 3
    assert len(harness["unprofiled_windows"]) == 1 and not harness["steps"]["stopped_after_window"]
    assert harness["steps"]["defined_at"] == _line(GENERATE, "@torch.no_grad()")  # where its code begins
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.run_mode == "inference"
    # the window is generate's second call: its prompt holds 4 tokens, and each of its 4 forwards adds one
    embeddings = [op for op in profile.operators if op.operator_name == "aten::embedding"]
    assert [op.input_shapes[1] for op in embeddings] == [[2, 4], [2, 5], [2, 6], [2, 7]]
    assert {op.module_path for op in embeddings} == {"embed"}
    cats = [op for op in profile.operators if op.operator_name == "aten::cat"]
    assert len(cats) == 4 and {op.call_site for op in cats} == {_line(GENERATE, "tokens = torch.cat(")}

    out = tmp_path / "module"
    proc = run_cli("profile", "--script", str(GENERATE), "--window-fn", "TinyLM", "--steps", "2:1", "-o", str(out),
                   "-q", "--", "--prompts", "1", "--new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "torch" / "harness.json").read_text())["steps"]["kind"] == "module"
    embeddings = [op for op in load_profile(out / "profile.json").operators if op.operator_name == "aten::embedding"]
    assert [op.input_shapes[1] for op in embeddings] == [[2, 5]], "the third forward: 3 prompt tokens and 2 new"


COMPILED_INFERENCE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x)


if __name__ == "__main__":
    model = torch.compile(Net().eval())
    with torch.no_grad():
        for _ in range(6):
            out = model(torch.randn(8, 16))
"""


def test_a_compiled_modules_calls_are_the_steps_its_class_names(tmp_path):
    """`--window-fn Net` counts the calls of a model the script wrapped in torch.compile: the wrapper is named as the
    module it wraps (its own class is OptimizedModule)."""
    script = tmp_path / "infer.py"
    script.write_text(COMPILED_INFERENCE)
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "Net", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    # the window is the fourth call; the script's last two are timed without the profiler
    assert harness["steps"]["kind"] == "module" and harness["steps"]["seen"] == 6 and harness["root_module"] == "Net"
    assert len(harness["unprofiled_windows"]) == 2
    assert harness["graph_breaks"] == []


def test_activation_checkpointing_recomputes_inside_the_modules_it_reruns(tmp_path):
    """Non-reentrant checkpointing re-runs each block's forward inside the backward and stops it by raising inside
    the modules it re-runs: their ranges still end there, so the backward work after it keeps its own modules (all
    of it was charged to the last re-run module, `ff.2`, before). The work run again is marked recomputed, at its
    own lines (it took the line of the backward node that ran it, and that node, before)."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPTS / "checkpoint_train.py"), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    backward = [op for op in load_profile(out / "profile.json").operators if op.phase == "backward"]
    for block in range(3):
        mine = [op for op in backward if (op.module_path or "").startswith(f"blocks.{block}.")]
        recomputed = [op.module_path for op in mine if op.operator_name == "aten::linear"]
        assert recomputed == [f"blocks.{block}.ff.0", f"blocks.{block}.ff.2"]  # the forward, again
        gelu = [op.module_path for op in mine if op.operator_name == "aten::gelu_backward"]
        assert gelu == [f"blocks.{block}.ff.1"]
        assert f"blocks.{block}.ff.0" in {op.module_path for op in mine if op.operator_name == "aten::mm"}
    # the forward run again is marked as such, each call at its own line in the forward (not the line of the
    # backward node that ran it), and tied to no autograd node; the backward's own work still is
    lines = {marker: f"{SCRIPTS / 'checkpoint_train.py'}:{number}" for number, text in
             enumerate((SCRIPTS / "checkpoint_train.py").read_text().splitlines(), 1)
             for marker in ("NORM_LINE", "FF_LINE") if text.endswith(marker)}
    recomputed = [op for op in backward if op.recomputed]
    assert {(op.operator_name, op.call_site) for op in recomputed} == {
        ("aten::layer_norm", lines["NORM_LINE"]), ("aten::linear", lines["FF_LINE"]), ("aten::gelu", lines["FF_LINE"])}
    assert all(op.autograd_node is None and op.forward_op is None for op in recomputed)
    assert len([op for op in recomputed if op.operator_name == "aten::layer_norm"]) == 3
    assert {op.forward_op for op in backward if op.operator_name == "aten::gelu_backward"} == {"aten::gelu"}
    operators = load_profile(out / "profile.json").operators
    assert not any(op.recomputed for op in operators if op.phase != "backward")
    # the clipping between the backward and the step is the update's; the loss, outside the model too, the forward's
    assert {op.phase for op in operators if op.operator_name == "aten::linalg_vector_norm"} == {"optimizer"}
    assert {op.phase for op in operators if op.operator_name in ("aten::square", "aten::mean")} == {"forward"}


def test_reentrant_checkpointing_differentiates_the_calls_it_runs_again_at_their_lines(tmp_path):
    """Reentrant checkpointing runs the forward under no_grad: the backward's nodes are those of the forward the
    checkpoint's node runs again, and take its modules and lines (they took the line of `loss.backward()`)."""
    script, out = SCRIPTS / "checkpoint_train.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--steps", "2:1", "-o", str(out), "-q", "--", "--reentrant")
    assert proc.returncode == 0, proc.stderr
    backward = [op for op in load_profile(out / "profile.json").operators if op.phase == "backward"]
    lines = {_line(script, "# NORM_LINE"), _line(script, "# FF_LINE")}
    for block in (1, 2):
        mine = [op for op in backward if (op.module_path or "").startswith(f"blocks.{block}.")]
        assert [op.module_path for op in mine if op.recomputed and op.operator_name == "aten::linear"] == [
            f"blocks.{block}.ff.0", f"blocks.{block}.ff.2"]
        nodes = [op for op in mine if not op.recomputed]
        assert {op.forward_op for op in nodes} == {"aten::linear", "aten::gelu", "aten::layer_norm"}
        assert {op.call_site for op in mine} == lines


def test_a_training_loop_without_an_optimizer_is_windowed_by_its_backward_calls(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(MANUAL), "-o", str(tmp_path / "none"), "-q")
    assert proc.returncode == 1 and "--window-fn backward for a training loop that updates without" in proc.stderr
    proc = run_cli("profile", "--script", str(MANUAL), "--window-fn", "backward", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    harness = json.loads((out / "torch" / "harness.json").read_text())
    # its 6 steps: 3 to warm up, the window, then 2 timed without the profiler before the script ends
    assert harness["steps"] == {**harness["steps"], "kind": "backward", "name": "backward()", "warmup": 3,
                                "active": 1, "seen": 6, "stopped_after_window": False}
    assert len(harness["unprofiled_windows"]) == 2
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.run_mode == "train_step"
    ops = profile.operators
    linears = [op for op in ops if op.operator_name == "aten::linear"]
    assert [op.module_path for op in linears] == ["0", "2"]
    assert {op.module_path for op in ops if op.phase == "backward" and op.operator_name == "aten::mm"} == {"0", "2"}
    update = [op for op in ops if op.operator_name == "aten::sub_"]
    assert len(update) == 4 and {op.call_site for op in update} == {_line(MANUAL, "p -= 0.01 * p.grad")}, (
        "the window opens as a backward ends: the step's hand-written update is in it")
    assert {(op.phase, op.module_path) for op in update} == {("optimizer", "Sequential")}, (
        "the code between a backward() and the next module call is the loop's optimizer phase")
    assert {op.phase for op in linears} == {"forward"}


def test_a_script_that_ends_before_its_window_says_how_many_steps_it_made(tmp_path):
    proc = run_cli("profile", "--script", str(TRAIN), "--steps", "20:1", "-o", str(tmp_path / "run"), "-q")
    assert proc.returncode == 1
    assert "the script ended after 8 optimizer step() calls; its window needs 21 (20 to warm up)" in proc.stderr
    proc = run_cli("profile", "--script", str(GENERATE), "--window-fn", "no_such_function", "--steps", "1:1",
                   "-o", str(tmp_path / "other"), "-q")
    assert proc.returncode == 1 and "check that the script calls no_such_function" in proc.stderr
    proc = run_cli("summary", str(tmp_path), "--", "--epochs", "2")
    assert proc.returncode == 2 and "only profile and run take them" in proc.stderr


def test_the_timing_pass_measures_several_windows_of_a_script(tmp_path):
    """The harness as the timing pass runs it (`--profiler kernels --windows 3`): after the warm-up step, three
    windows of two steps each, then the two traced ones (no CUDA here: nothing is traced), back to back."""
    result = tmp_path / "harness.json"
    proc = subprocess.run(
        [sys.executable, str(child_script("harness")), "--workload", str(TRAIN), "--run-dir", str(tmp_path),
         "--result", str(result), "--profiler", "kernels", "--kineto-trace", str(tmp_path / "k.json"),
         "--windows", "3", "--warmup-iters", "1", "--iters", "2", "--run-script", "--script-arg=--epochs",
         "--script-arg=9"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    harness = json.loads(result.read_text())
    assert harness["steps"]["seen"] == 1 + (3 + 2) * 2 and harness["steps"]["stopped_after_window"]
    assert len(harness["windows"]) == 3 and len(harness["traced_windows"]) == 2
    assert all(w["wall_time_ns"] > 0 for w in harness["windows"] + harness["traced_windows"])
    assert "no CUDA device: the timing pass traced no kernels" in harness["warnings"]


def test_script_options_are_checked_before_anything_runs():
    options = CaptureOptions(script=True, steps="2:5")
    assert (options.warmup_iters, options.iters) == (2, 5)
    assert CaptureOptions(script=True, steps="2:5", warmup_iters=2).iters == 5
    for bad, message in (
        (dict(script=True, steps="2:5", iters=1), "disagree"),
        (dict(script=True, steps="2-5"), "is not W:A, W warm-up steps then A steps in the window"),
        (dict(window_fn="generate"), "add script"),
        (dict(script=True, compile_mode="inductor"), "runs as it is written"),
        (dict(script=True, warmup_iters=0), "at least 1"),
        (dict(script=True, window_fn="--x"), "looks like a command-line option"),
    ):
        with pytest.raises(ValueError, match=message):
            CaptureOptions(**bad)


def test_script_mode_is_a_request_of_the_facade_and_a_parameter_of_the_mcp_tool(tmp_path):
    import anyio
    from mcp import Client

    from mcp_server.serve.app import server

    async def tool_schema() -> dict:
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            return tools["profile"].input_schema["properties"]

    properties = anyio.run(tool_schema)
    assert {"script", "script_args", "window_fn", "steps"} <= set(properties)
    from mcp_server.api import profile as api_profile
    from mcp_server.schema.requests import Interpreter, ProfileRequest

    with pytest.raises(UsageError, match="--memory needs get_model_and_input"):
        api_profile(ProfileRequest(workload=TRAIN, python=Interpreter(python=sys.executable), project=tmp_path,
                                   capture=CaptureOptions(script=True), backend="torch", memory=True))


def test_a_script_pass_beside_the_first_compiling_one_waits_for_its_tuned_kernels():
    """A pass that warms up beside the first compiling one (`--warm-up-early`) takes that pass's tuned Triton
    configurations once its script compiles (autotuned again there, a kernel could launch with another grid than the
    timeline's); the first pass tunes them itself. Child processes: the patch lasts for the process."""
    check = ("import torch\nfrom mcp_server.children.compiling import ScriptCompiles\n"
             "from torch._inductor.runtime import triton_heuristics as h\n"
             "compiles = ScriptCompiles(reuse_tuned={reuse})\n"
             "torch.nn.Linear(2, 2).compile()\ncompiles.remove()\n"  # Module.compile calls torch.compile
             "assert torch.compile is compiles._real and compiles.recorder.root == 'Linear'\n"
             "print(h.CachingAutotuner.autotune_to_one_config.__name__)\n")
    names = [subprocess.run([sys.executable, "-c", check.format(reuse=reuse)], capture_output=True, text=True,
                            cwd=REPO, timeout=120, check=True).stdout.strip() for reuse in (True, False)]
    assert names == ["wait_for_tuned", "autotune_to_one_config"]


def test_a_custom_autograd_functions_backward_differentiates_its_forward_call(tmp_path):
    """Its node takes the number an index op of the batch carried before it (that op created no node): the backward
    is the Function's (`Square`), not the index op's, whose range carried the number last before. Autograd runs the
    Function's backward with no torch function mode of the caller's: the call-site mode is entered around it, so
    its work takes the backward's own line, not the index op's or the backward() call's."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(CUSTOM_FUNCTION), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    backward = [op for op in load_profile(out / "profile.json").operators if op.autograd_node == "SquareBackward"]
    assert backward and {op.forward_op for op in backward} == {"Square"}
    assert {op.call_site for op in backward} == {_line(CUSTOM_FUNCTION, "return 2 * x * grad")}


def test_a_window_the_script_ends_inside_is_dropped_not_kept_short(tmp_path):
    """An optimizer step's window opens as a step ends: when the script ends after its last step, the window just
    opened holds only the script's tail. It is dropped (kept, it was a window of a fraction of a step: a traced one
    held no kernel), and the warning says how many whole windows were measured."""
    result = tmp_path / "harness.json"
    proc = subprocess.run(
        [sys.executable, str(child_script("harness")), "--workload", str(TRAIN), "--run-dir", str(tmp_path),
         "--result", str(result), "--profiler", "kernels", "--kineto-trace", str(tmp_path / "k.json"),
         "--windows", "10", "--warmup-iters", "1", "--iters", "1", "--run-script"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    harness = json.loads(result.read_text())
    steps = harness["steps"]["seen"]
    assert steps == 8 and not harness["steps"]["stopped_after_window"]
    assert len(harness["windows"]) == steps - 1  # steps 2..8, one window each; the one opened after step 8 dropped
    assert "traced_windows" not in harness
    assert f"the script ended after {steps} steps: {steps - 1} of 12 windows of 1 step(s) were measured" in (
        harness["warnings"])


def test_the_worker_threads_of_a_pool_started_before_the_window_are_profiled(tmp_path):
    """The pool's threads start in the warm-up, before any window: their operators, modules and call sites are
    recorded as the main thread's are."""
    script, out = SCRIPTS / "pooled_serve.py", tmp_path / "run"
    proc = run_cli("profile", "--script", str(script), "--window-fn", "serve", "--steps", "1:1", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    ops = load_profile(out / "profile.json").operators
    calls = Counter((op.module_path, op.operator_name, op.call_site) for op in ops if op.module_path is not None)
    model_line = _line(script, "scores = model(batch)")
    assert calls == {("0", "aten::linear", model_line): 4, ("1", "aten::relu", model_line): 4,
                     ("2", "aten::linear", model_line): 4}
    assert Counter(op.call_site for op in ops if op.operator_name == "aten::argmax") == {
        _line(script, "return scores.argmax"): 4}
