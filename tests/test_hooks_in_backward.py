"""Work the workload's own hooks run inside the backward: a gradient clipped by a tensor hook (`register_hook`) and an
optimizer stepped from a leaf's post-accumulate-grad hook (the optimizer fused into the backward pass). Autograd runs
both without the caller's torch function modes, and the optimizer's step runs inside autograd's `AccumulateGrad`
operator; the step that ends a window runs inside a backward. A real plain script
(`scripts/gpu_workloads/offload_hooks_train.py`, activations offloaded with `save_on_cpu` too) under the real CLI and
harness with torch.profiler on this CPU; its H200 recording under nsys replays in `tests/test_direct_launches.py`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import extract_fixture
from test_script_mode import run_cli

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.io import load_profile

SCRIPT = REPO / "scripts" / "gpu_workloads" / "offload_hooks_train.py"


def _line(path: Path, text: str) -> str:
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path}:{number}"


def test_hooks_in_the_backward_take_their_own_lines_and_the_fused_optimizer_its_phase(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPT), "--steps", "2:1", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    ops = load_profile(out / "profile.json").operators
    # the steps end inside the backward (on a GPU, on autograd's device thread): the window opens and closes once the
    # backward has returned to the script, so it holds a forward and the whole backward after it
    in_order = sorted(ops, key=lambda op: op.host_start_ns or 0)
    assert in_order[0].phase == "forward" and in_order[-1].phase in ("backward", "optimizer")
    step_line, clip_line = _line(SCRIPT, "optimizers[parameter].step()"), _line(SCRIPT, "grad.clamp(-clip, clip)")
    parameters = 29  # embedding, 2 blocks of 13, final norm's 2, head's 2 (small scale)
    # each parameter's AdamW step: operators of their own, in the optimizer phase, at the hook's line, in the module
    # holding the parameter; autograd's AccumulateGrad keeps none of them
    updates = [op for op in ops if op.phase == "optimizer"]
    assert Counter(op.operator_name for op in updates)["aten::addcdiv_"] == parameters
    assert {op.call_site for op in updates} == {step_line}
    assert {"embed", "head", "norm", "blocks.0.mlp.0", "blocks.1.attention"} <= {op.module_path for op in updates}
    accumulate = [op for op in ops if op.operator_name == "torch::autograd::AccumulateGrad"]
    assert len(accumulate) == parameters and all(op.phase == "backward" for op in accumulate)
    nested = {name for op in accumulate for name in op.aggregated.cpu_self_time_by_operator_ns or {}}
    assert not nested & {op.operator_name for op in updates}, nested
    # the clipping hook's clamp: in the backward, at the hook's own line (not the forward line of its parameter's use)
    clips = [op for op in ops if op.operator_name == "aten::clamp"]
    assert len(clips) == parameters and {(op.phase, op.call_site) for op in clips} == {("backward", clip_line)}
    # the offloaded activations come back to the device in the backward, at their forward calls' lines
    assert any(op.phase == "backward" and op.operator_name == "aten::to" and op.module_path for op in ops)


def test_the_h200_recording_has_the_fused_optimizer_and_the_clipping_at_their_lines(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`h200_offload_hooks_train.tar.xz`: the script as it is (`run --script --steps 2:1`, its nsys and timing passes),
    recorded by `scripts/record_real_workloads.py --cases offload_hooks_train` on an H200 on 2026-11-30 once these
    fixes were in. Before them its run failed: the window's last step ended on autograd's device thread, where the
    profiler's state is not the script's ("Can't disable Kineto profiler when it's not running")."""
    run = extract_fixture("h200_offload_hooks_train", tmp_path_factory) / "offload_hooks_train"
    profile = assemble(RunDir(run))
    window = profile.window
    assert window.attributed_kernel_time_pct == 100.0 and window.call_site_kernel_time_pct == 100.0
    step_line, clip_line = (_line(SCRIPT, text).rsplit("/", 1)[-1] for text in ("optimizers[parameter].step()",
                                                                                   "grad.clamp(-clip, clip)"))
    with_kernels = [op for op in profile.operators if op.kernels]
    updates = [op for op in with_kernels if op.phase == "optimizer"]
    assert (window.kernel_time_by_phase_ns or {}).get("optimizer", 0) > 0
    assert {op.call_site.rsplit("/", 1)[-1] for op in updates if op.call_site} == {step_line}
    assert len({op.module_path for op in updates}) == 23  # every module holding a parameter (4 blocks of 5, 3 more)
    assert not any(op.operator_name == "torch::autograd::AccumulateGrad" for op in with_kernels)
    clips = [op for op in with_kernels if op.operator_name == "aten::clamp"]
    assert len(clips) == 53 and {(op.phase, op.call_site.rsplit("/", 1)[-1]) for op in clips} == {
        ("backward", clip_line)}
    # the activations offloaded in the forward and brought back in the backward, each copy at a line
    copies = Counter((e.copy_kind, e.phase) for e in profile.runtime_events or [] if e.kind == "memcpy"
                     and e.origin == "workload" and e.call_site)
    assert copies[("DtoH", "forward")] == copies[("HtoD", "backward")] == 112
    assert not [e for e in profile.runtime_events or [] if e.kind == "memcpy" and e.origin == "workload"
                and not e.call_site]
    in_order = sorted(profile.operators, key=lambda op: op.host_start_ns or 0)
    assert in_order[0].phase == "forward" and in_order[-1].phase == "optimizer"
