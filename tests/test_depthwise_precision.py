"""A depthwise convolution is judged FP32-on-CUDA-cores only when its kernel says it computes in float.

Replayed from real profiles: `h200_convnext_winner.profile.json.xz` (scripts/gpu_workloads/convnext_small.py's
reduced-tier winner, the whole model in float16 under CUDA graph trees, H200) runs its 7x7 depthwise convolutions in
cuDNN's `conv2d_c1_k1_nhwc_specialized`: float16 data accumulated in FP32 (FFMA, no tensor pipe), and a graph replay
records no dtype. examples/depthwise_separable_conv/profile.json (eager FP32, H100) runs ATen's
`conv_depthwise2d_forward_kernel<3, float, int>`.
"""

from __future__ import annotations

import lzma
from pathlib import Path

from conftest import REPO
from fixtures_util import FIXTURES

from mcp_server.analysis import analyze_profile
from mcp_server.schema.io import load_profile


def _analysis(path: Path, out: Path):
    return analyze_profile(load_profile(path), out, profile_path=path, measure=False)


def test_a_half_precision_depthwise_convolution_is_not_offered_tensor_cores(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_convnext_winner.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    depthwise = [k for op in profile.operators for k in op.kernels if k.kernel_name == "conv2d_c1_k1_nhwc_specialized"]
    assert len(depthwise) == 10 and all((k.metrics["inst_ffma"].value or 0) > 0 for k in depthwise)
    analysis = _analysis(path, tmp_path / "out")
    assert "fp32_conv" not in {f.kind for f in analysis.findings}
    assert not any("FP32 convolutions" in o.title for o in analysis.opportunities)


def test_an_fp32_depthwise_convolution_still_is(tmp_path: Path) -> None:
    analysis = _analysis(REPO / "examples" / "depthwise_separable_conv" / "profile.json", tmp_path)
    [finding] = [f for f in analysis.findings if f.kind == "fp32_conv"]
    assert "kernels=5" in finding.triggers
    assert any(o.title.startswith("Run 5 FP32 convolutions on tensor cores") for o in analysis.opportunities)
