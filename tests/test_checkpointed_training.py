"""A training script with activation checkpointing, replayed from its H200 recording.

`h200_prefetch_lm_train.tar.xz`: scripts/gpu_workloads/prefetch_lm_train.py as it is (`run --script`: a GPT-style
model with every block checkpointed by `torch.utils.checkpoint`, non-reentrant; its batches copied one step ahead on
a side stream from pinned memory; gradients clipped before fused AdamW's step), recorded by
`scripts/record_real_workloads.py --cases prefetch_lm_train` on an H200 on 2026-11-30 (its nsys and timing passes).
Each block's forward runs again inside the backward, on autograd's thread, where no call-site range runs: those calls
took the autograd node whose backward ran them (AddmmBackward0 of the block's last linear) as their node and forward
op, and that linear's line as their call site, and the gradient clipping after the backward was labelled forward.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.diagnosis import stage_rows
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

SCRIPT = REPO / "scripts" / "gpu_workloads" / "prefetch_lm_train.py"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    run = extract_fixture("h200_prefetch_lm_train", tmp_path_factory) / "prefetch_lm_train"
    return assemble(RunDir(run))


def _line(text: str) -> str:
    """`path:line` of the recorded script's line that starts with `text` (the recording ran it from /work/main)."""
    lines = SCRIPT.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.strip().startswith(text))
    return f"/work/main/scripts/gpu_workloads/prefetch_lm_train.py:{number}"


def test_forward_work_run_again_in_the_backward_keeps_its_own_lines(profile: OperatorAttributedProfile) -> None:
    assert profile.window.attributed_kernel_time_pct == 100.0
    again = [op for op in profile.operators if op.recomputed]
    block_lines = {_line("q, k, v = self.qkv"), _line("y = F.scaled_dot_product_attention"),
                   _line("x = x + self.proj"), _line("return x + self.mlp")}
    assert {op.call_site for op in again} == block_lines  # not the last linear's line for every call
    assert {op.phase for op in again} == {"backward"}
    assert all(op.autograd_node is None and op.forward_op is None for op in again)
    assert {op.module_path.split(".")[:2][0] for op in again if op.module_path} == {"blocks"}
    assert {op.module_path.split(".")[1] for op in again if op.module_path} == {str(b) for b in range(6)}
    # calls of the forward again (until the last activation the backward needs: checkpointing stops there)
    forward = Counter((op.module_path, op.operator_name) for op in profile.operators if op.phase == "forward")
    assert not Counter((op.module_path, op.operator_name) for op in again) - forward
    # the backward's own work still differentiates its forward op, at that op's line
    gradients = [op for op in profile.operators
                 if op.operator_name == "aten::_scaled_dot_product_cudnn_attention_backward"]
    assert len(gradients) == 6 and {op.forward_op for op in gradients} == {"aten::scaled_dot_product_attention"}
    assert {op.call_site for op in gradients} == {_line("y = F.scaled_dot_product_attention")}


def test_the_clipping_between_backward_and_step_is_the_updates(profile: OperatorAttributedProfile) -> None:
    phases = {}
    for op in profile.operators:
        if not op.module_path:
            phases.setdefault(op.operator_name, set()).add(op.phase)
    assert phases["aten::_foreach_norm"] == phases["aten::_foreach_mul_"] == {"optimizer"}
    assert phases["aten::cross_entropy_loss"] == {"forward"}  # the loss, outside the model, before the backward
    clipping = [k for op in profile.operators if op.operator_name == "aten::_foreach_norm" for k in op.kernels]
    assert clipping and {k.phase for k in clipping} == {"optimizer"}
    by_phase = profile.window.kernel_time_by_phase_ns or {}
    assert by_phase["optimizer"] == sum(k.duration_ns for op in profile.operators if op.phase == "optimizer"
                                        for k in op.kernels)
    # the next batch's copy, on the side stream from pinned memory, at the script's line
    copies = [e for e in profile.runtime_events if e.kind == "memcpy" and e.copy_kind == "HtoD"]
    assert [(e.src_memory, e.call_site) for e in copies] == [
        ("pinned", _line("return host.to(self.device, non_blocking"))]


def test_the_analysis_says_what_recomputing_costs(profile: OperatorAttributedProfile, tmp_path: Path) -> None:
    analysis = analyze_profile(profile, out_dir=tmp_path, measure=False)
    again = [op for op in profile.operators if op.recomputed]
    spent = sum(k.duration_ns for op in again for k in op.kernels)
    finding = next(f for f in analysis.findings if f.kind == "recomputed_forward")
    assert f"kernel_time_ns={spent}" in finding.triggers and len(finding.operators) == len(again) == 54
    assert f"{spent / 1e3:.1f} us" in finding.title
    rows = stage_rows(analysis.operators, analysis.kernels, limit=1000)
    recomputed_rows = [row for row in rows if row.label.endswith("(backward, recomputed)")]
    assert recomputed_rows and all((row.module_path or "").startswith("blocks") for row in recomputed_rows)
    assert sum(row.duration_ns for row in recomputed_rows) == spent
    flagged = [op for op in analysis.operators if op.recomputed]
    assert len(flagged) == 54 and all("recomputed (checkpointing)" in (op.key_issue or "") for op in flagged)
