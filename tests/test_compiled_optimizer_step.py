"""A script that compiles its optimizer's step (`torch.compile` around `optimizer.step()`, a tensor learning rate) keeps
it compiled under the profiler. The call-site mode's `has_torch_function`, seen by Dynamo as an unknown torch call
returning a bool, made Dynamo skip AdamW's step (`1 - lr` on a tensor runs through `torch/_tensor.py`'s Python
operators) and run it eagerly in every profiled pass; and the step counter's hooks, traced into the step, broke it
too. On the H200 the recorded training script (`scripts/gpu_workloads/compiled_optimizer_train.py`) showed eager
`aten::_foreach_*` kernels for a step that runs as Triton kernels without the profiler. The real CLI and harness
with torch.profiler on this CPU."""

from __future__ import annotations

import json
from collections import Counter

from conftest import REPO
from fixtures_util import recorded_profile
from test_script_mode import run_cli

SCRIPT = REPO / "tests" / "scripts" / "compiled_step_train.py"


def _inside(outer: dict, inner: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1


def test_a_compiled_optimizer_step_stays_compiled_and_is_counted(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPT), "--steps", "3:1", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    profile = json.loads((out / "profile.json").read_text())
    assert profile["capture_metadata"].get("graph_breaks") in (None, [])  # no function skipped, ours not named
    harness = json.loads((out / "torch" / "harness.json").read_text())
    # its 6 steps: 3 to warm up, the window, then 2 timed without the profiler (no CUDA here) before it ends
    assert harness["steps"]["kind"] == "optimizer" and harness["steps"]["seen"] == 6
    assert len(harness["unprofiled_windows"]) == 2
    events = [e for e in json.loads((out / "torch" / "kineto_trace.json").read_text())["traceEvents"]
              if e.get("ph") == "X"]
    window = next(e for e in events if e["name"] == "operator_profiler::measure")
    steps = [e for e in events if e["name"].startswith("Optimizer.step#AdamW") and _inside(window, e)]
    graphs = [e for e in events if e["name"].startswith("## Call CompiledFxGraph")]
    # the step's hooks and ranges ran (the step is the optimizer's, at its module), its body as a compiled graph
    assert len(steps) == 1 and any(_inside(steps[0], g) for g in graphs)
    assert any(e["name"] == "operator_profiler::step_of:Sequential" and _inside(steps[0], e) for e in events)


def test_the_h200_recording_of_a_compiled_step_holds_inductors_kernels_in_the_update(tmp_path) -> None:
    """`h200_compiled_optimizer_train.profile.json.xz`: scripts/gpu_workloads/compiled_optimizer_train.py as it is
    (`run --script --steps 3:2 -- --epochs 2`: the model and the step compiled), recorded by
    `scripts/record_real_workloads.py --cases compiled_optimizer_train` on an H200 on 2026-11-30 once the step stayed
    compiled. Recorded before, the update was 148 eager `aten::_foreach_*` kernels (333.7 us of kernel time); now it
    is Inductor's three fused kernels, twice (38.6 us), as without the profiler. Their line is not named (0.26 % of
    the kernel time): Dynamo compiled the step's body as a frame of its own, whose nodes hold no frame of the
    script's."""
    profile = recorded_profile("h200_compiled_optimizer_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0 and not profile.capture_metadata.graph_breaks
    update = [(op, k) for op in profile.operators if op.phase == "optimizer" for k in op.kernels]
    assert Counter(k.kernel_name for _, k in update) == {f"triton_for_fused_{i}": 2 for i in range(3)}
    assert {op.module_path for op, _ in update} == {"Net"} and all(op.compiled_graph for op, _ in update)
    assert (profile.window.kernel_time_by_phase_ns or {})["optimizer"] == sum(k.duration_ns for _, k in update)
