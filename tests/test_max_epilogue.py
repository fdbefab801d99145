"""The max-pool epilogue pattern: its Triton kernel equals the chain it replaces (run by Triton's interpreter on the
CPU), it is a well-formed torch.library op with the chain's gradient, the rewrite finds the chains of the own PointNet
and keeps its output, and the analysis finds a GEMM output only max-pooled in PointNet's recorded H200 profiles (eager,
and its reduced tier's winner) and offers the pattern, and nowhere else."""

from __future__ import annotations

import pytest
import torch
from conftest import load_pattern, own_workload_at_small_scale, under_triton_interpreter
from fixtures_util import extract_fixture, recorded_profile
from torch import nn

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.pooled_gemms import pooled_gemm_output
from mcp_server.analysis.timeline_health import place_kernels, window_length
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir


def _pattern():
    return load_pattern("max_epilogue")



def test_the_kernel_under_triton_s_interpreter_equals_the_chain() -> None:
    """The Triton kernel on CPU tensors in a fresh process (Triton's interpreter, one block shape): channel and point
    counts that are not multiples of its blocks, with and without the ReLU, float32 products kept exact."""
    pytest.importorskip("triton")
    rows = under_triton_interpreter("max_epilogue", """
torch.manual_seed(0)
rows = []
for (b, k, p, n), relu in [((3, 40, 70, 100), True), ((2, 16, 33, 17), False), ((1, 3, 5, 64), True)]:
    x, w = torch.randn(b, k, p), torch.randn(n, k)
    scale, shift = torch.rand(n) + 0.5, torch.randn(n)
    got, ref = op._conv1x1_max_triton(x, w, scale, shift, relu), op.reference_conv1x1_max(x, w, scale, shift, relu)
    rows.append([list(got.shape), float((got - ref).abs().max() / ref.abs().max())])
print(json.dumps(rows))
""")
    assert [r[0] for r in rows] == [[3, 100], [2, 17], [1, 64]]
    assert max(err for _, err in rows) < 1e-5


def test_the_op_is_a_well_formed_library_op_with_the_chain_s_gradient() -> None:
    _pattern()
    op = torch.ops.operator_profiler_patterns.conv1x1_max
    args = (torch.randn(2, 5, 7, requires_grad=True), torch.randn(6, 5), torch.rand(6) + 0.5, torch.randn(6), True)
    assert set(torch.library.opcheck(op, args).values()) == {"SUCCESS"}
    for relu in (True, False):
        x = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
        weight, scale, shift = torch.randn(6, 5, dtype=torch.float64), torch.rand(6) + 0.5, torch.randn(6)
        grad = torch.randn(2, 6, dtype=torch.float64)
        ours, = torch.autograd.grad(op(x, weight, scale, shift, relu), x, grad)
        reference, = torch.autograd.grad(_pattern().reference_conv1x1_max(x, weight, scale, shift, relu), x, grad)
        assert torch.allclose(ours, reference)


class _Shared(nn.Module):
    """A pointwise MLP's last layer and its max pool, the pooled activation also read elsewhere when `leak`."""

    def __init__(self, leak: bool) -> None:
        super().__init__()
        self.conv, self.norm, self.leak = nn.Conv1d(4, 8, 1), nn.BatchNorm1d(8), leak

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.norm(self.conv(x)))
        pooled = y.max(dim=2)[0]
        return pooled + y.mean() if self.leak else pooled


def test_the_rewrite_folds_conv_and_norm_and_leaves_an_activation_read_elsewhere() -> None:
    fuse = _pattern().fuse_conv_max
    torch.manual_seed(0)
    for leak, expected in ((False, 1), (True, 0)):
        model = _Shared(leak)
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
        model.eval()
        x = torch.randn(3, 4, 9)
        fused, replaced = fuse(model)
        assert replaced == expected
        assert torch.allclose(fused(x), model(x), atol=1e-5)


def test_the_own_pointnet_keeps_its_output_with_both_pools_fused() -> None:
    """scripts/gpu_workloads/pointnet_optimized.py at the small scale, compiled (Inductor on the CPU, float16 autocast
    there being the CPU's): both max pools replaced, the output within the reduced tier's tolerance of the baseline."""
    check = """
import json, torch, pointnet as base, pointnet_optimized as opt
model, (x,) = base.get_model_and_input()
expected = model(x)
out = opt.optimize(model)(x).float()
print(json.dumps([float((out - expected).abs().max() / expected.abs().max()), opt.APPLIED_PASSES]))
"""
    error, passes = own_workload_at_small_scale(check)
    assert error < 1e-2 and passes == {"max_epilogue": 2, "inductor": 1}


@pytest.mark.parametrize("name, mode, kernels", [("h200_pointnet_eager", "eager", 10),
                                                  ("h200_pointnet_winner", "optimized", 4)])
def test_pointnet_s_recorded_profiles_show_two_pooled_gemm_outputs(name: str, mode: str, kernels: int,
                                                                    tmp_path) -> None:
    """PointNet on an H200, eager (conv1d's GEMM and bias kernels, BatchNorm, ReLU, amax) and its reduced tier's
    winner (cuDNN's GEMM, then Inductor's reduction that absorbed BatchNorm, ReLU and amax): the analysis offers the
    pattern first, with an estimate the measured gain stays under (127 µs a call by latency,
    docs/measurements/h200_unseen_workloads.json)."""
    profile = recorded_profile(name, tmp_path)
    assert profile.capture_metadata.compile_mode == mode
    found = pooled_gemm_output(profile, place_kernels(profile, window_length(profile)[0]))
    assert found is not None and {"pooled_chains=2", f"chain_kernels={kernels}"} <= set(found.triggers)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis")
    first = analysis.opportunities[0]
    assert first.change_class == "max_epilogue" and first.knowledge == "knowledge/fx_patterns/max_epilogue.py"
    assert first.findings == ["pooled_gemm_output"]
    if mode == "optimized":
        assert first.estimated_saving_ns >= 127_000


@pytest.mark.parametrize("name, case", [
    ("h200_conv_block_inductor", "conv_block_inductor"), ("h200_gpt2_inductor", "gpt2_inductor"),
    ("h100_moe_routing", "moe_routing")])
def test_no_pooled_gemm_output_elsewhere(name: str, case: str, tmp_path_factory) -> None:
    profile = assemble(RunDir(extract_fixture(name, tmp_path_factory) / case))
    assert pooled_gemm_output(profile, place_kernels(profile, window_length(profile)[0])) is None
