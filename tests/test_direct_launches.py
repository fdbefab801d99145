"""Kernels a workload launches itself, with no operator range around them, replayed from an H200 recording.

`h200_triton_norm_train.tar.xz`: scripts/gpu_workloads/triton_norm_train.py as it is (`run --script`: a Llama-style
language model whose RMSNorm is two `@triton.jit` kernels launched by a `torch.autograd.Function`, trained with
AdamW), recorded by `scripts/record_real_workloads.py --cases triton_norm_train` on an H200 on 2026-11-30 (its nsys
and timing passes), recorded again once Triton's launch hooks named each launch's line, and the torch calls of the
Function's backward theirs. No aten operator encloses
those launches: its 18 kernels were left unattributed (99.52 % of the kernel time attributed), then had no line, and
the seed gradient `loss.backward()` makes (`torch.ones_like(loss)`) was forward work.
"""

from __future__ import annotations

import pytest
from conftest import REPO
from fixtures_util import extract_fixture

from mcp_server.assemble.attribute import DIRECT_DETAIL
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

NORMS = [f"blocks.{b}.norm{n}" for b in range(4) for n in (1, 2)] + ["norm"]


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    run = extract_fixture("h200_triton_norm_train", tmp_path_factory) / "triton_norm_train"
    return assemble(RunDir(run))


def test_a_triton_kernel_launched_in_a_module_is_a_call_of_its_own_there(profile: OperatorAttributedProfile) -> None:
    assert profile.window.attributed_kernel_time_pct == 100.0 and not profile.unattributed_kernels
    forward = [op for op in profile.operators if op.operator_name == "_rms_forward"]
    assert [op.module_path for op in forward] == NORMS  # each norm's own call, in the forward's order
    assert {op.phase for op in forward} == {"forward"}
    assert all(len(op.kernels) == 1 and op.kernels[0].kernel_name == "_rms_forward" for op in forward)
    assert {(k.attribution.method.value, k.attribution.confidence.value, k.attribution.detail)
            for op in forward for k in op.kernels} == {("nvtx_enclosure", "medium", DIRECT_DETAIL)}


def test_each_launch_takes_the_line_that_launched_it(profile: OperatorAttributedProfile) -> None:
    script = REPO / "scripts" / "gpu_workloads" / "triton_norm_train.py"
    lines = script.read_text().splitlines()
    for kernel, text in (("_rms_forward", "_rms_forward[("), ("_rms_backward", "_rms_backward[(")):
        number = next(i for i, line in enumerate(lines, 1) if text in line)
        sites = {op.call_site.rsplit("/", 1)[-1] for op in profile.operators if op.operator_name == kernel
                 and op.call_site}
        assert sites == {f"{script.name}:{number}"}, kernel
        assert sum(1 for op in profile.operators if op.operator_name == kernel) == len(NORMS)


def test_its_backward_kernel_takes_the_node_and_module_it_differentiates(profile: OperatorAttributedProfile) -> None:
    backward = [op for op in profile.operators if op.operator_name == "_rms_backward"]
    assert [op.module_path for op in backward] == NORMS[::-1]  # launched on autograd's thread, in reverse
    assert {(op.phase, op.autograd_node, op.forward_op) for op in backward} == {
        ("backward", "TritonRMSNormBackward", "TritonRMSNorm")}
    # the weight's gradient, summed by aten from the kernel's per-row parts, in the same node
    sums = [op for op in profile.operators if op.autograd_node == "TritonRMSNormBackward"
            and op.operator_name == "aten::sum"]
    assert [op.module_path for op in sums] == NORMS[::-1]
    # called by the Function's backward on autograd's device thread: its line (recorded once a call-site mode was
    # entered around such a backward there)
    script = REPO / "scripts" / "gpu_workloads" / "triton_norm_train.py"
    number = next(i for i, line in enumerate(script.read_text().splitlines(), 1) if "dw_part.sum(0)" in line)
    assert {(op.call_site or "").rsplit("/", 1)[-1] for op in sums} == {f"{script.name}:{number}"}


def test_the_seed_gradient_of_the_loss_is_backward_work(profile: OperatorAttributedProfile) -> None:
    seeds = [(i, op) for i, op in enumerate(profile.operators) if op.operator_name == "aten::ones_like"]
    assert len(seeds) == 1
    index, seed = seeds[0]
    assert seed.phase == "backward" and {k.phase for k in seed.kernels} == {"backward"}
    assert seed.call_site is not None and seed.call_site.endswith("triton_norm_train.py:139")  # loss.backward()
    assert profile.operators[index - 1].operator_name == "aten::cross_entropy_loss"
    assert profile.operators[index - 1].phase == "forward"  # the loss stays the forward's


def test_nvrtc_kernels_take_their_custom_operator_or_their_launch_line(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`h200_custom_kernel_serve.tar.xz`: scripts/gpu_workloads/custom_kernel_serve.py as it is (`run --script
    --window-fn serve --steps 2:2 -- --batches 24`: each block's bias and GELU an NVRTC kernel registered as
    `serve_ext::bias_gelu` with `torch.library.custom_op`, the logits' clamp a raw NVRTC launch in the model's
    forward), recorded by `scripts/record_real_workloads.py --cases custom_kernel_serve` on an H200 on 2026-11-30
    (its nsys and timing passes), once NVRTC launches were wrapped in `site:` ranges as Triton's are."""
    run = extract_fixture("h200_custom_kernel_serve", tmp_path_factory) / "custom_kernel_serve"
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct == 100.0 and profile.window.call_site_kernel_time_pct == 100.0
    script = REPO / "scripts" / "gpu_workloads" / "custom_kernel_serve.py"
    lines = script.read_text().splitlines()

    def line(text: str) -> str:
        return f"{script.name}:{next(i for i, source in enumerate(lines, 1) if text in source)}"

    found = {(k.kernel_name, op.operator_name, op.module_path, (op.call_site or "").rsplit("/", 1)[-1],
              k.attribution.detail) for op in profile.operators for k in op.kernels
             if k.kernel_name in ("bias_gelu", "scale_clamp")}
    # the custom operator's kernel under its name, in each block, at the launch inside its implementation
    assert {f for f in found if f[0] == "bias_gelu"} == {
        ("bias_gelu", "serve_ext::bias_gelu", f"blocks.{b}", line('kernel("bias_gelu", BIAS_GELU)('), None)
        for b in range(6)}
    # the raw launch: a call of its own, in the model, at its line
    assert {f for f in found if f[0] == "scale_clamp"} == {
        ("scale_clamp", "scale_clamp", "Classifier", line('kernel("scale_clamp", SCALE_CLAMP)('), DIRECT_DETAIL)}
