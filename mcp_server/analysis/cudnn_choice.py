"""Convolution kernels cuDNN chose by heuristic that leave the GPU almost empty: with its autotuner off
(`torch.backends.cudnn.benchmark`, off by default), cuDNN picks each convolution's algorithm from heuristics, and for
some shapes (a 3-channel layer's weight gradient, say) the pick launches a handful of blocks that run for
milliseconds on a few SMs. With the autotuner on, cuDNN times its algorithms on each new shape once and keeps the
fastest: a convolutional VAE's training step on an H200 went from 29.0 to 22.6 ms, the four such kernels (2 blocks
each, 2.36 ms each) gone (docs/measurements/h200_unseen_workloads.json, `nineteenth_stop`).
"""

from __future__ import annotations

from mcp_server.analysis.detect import gemm_kind
from mcp_server.analysis.rules import rule
from mcp_server.analysis.timeline_health import Placed, kernels_finding
from mcp_server.schema.analysis import Finding
from mcp_server.schema.profile import OperatorAttributedProfile


def _blocks(p: Placed) -> int:
    grid = p.kernel.grid or [1, 1, 1]
    return grid[0] * grid[1] * grid[2]


def underfilled_convolutions(profile: OperatorAttributedProfile, placed: list[Placed]) -> list[Placed]:
    """Convolution kernels (forward or backward) whose blocks fill at most `conv_choice.max_waves` of one wave and
    that run at least `conv_choice.min_kernel_ns`; none when cuDNN's autotuner was on or the SM count is unknown."""
    sms = profile.capture_metadata.sm_count
    if profile.capture_metadata.cudnn_benchmark or not sms:
        return []
    longest, waves = rule("conv_choice", "min_kernel_ns"), rule("conv_choice", "max_waves")
    return [p for p in placed
            if gemm_kind(p.op, p.kernel) == "conv" and p.kernel.duration_ns >= longest and _blocks(p) <= waves * sms]


def heuristic_convolutions(profile: OperatorAttributedProfile, placed: list[Placed]) -> Finding | None:
    """The window's under-filled heuristic convolution kernels as one finding (None without them)."""
    found = underfilled_convolutions(profile, placed)
    if not found:
        return None
    time_ns = sum(p.kernel.duration_ns for p in found)
    blocks = sorted({_blocks(p) for p in found})
    state = "off" if profile.capture_metadata.cudnn_benchmark is False else "not recorded (off by default)"
    return kernels_finding(
        "heuristic_conv", f"{len(found)} convolution kernel(s) cuDNN chose by heuristic run "
        f"{'/'.join(map(str, blocks))} block(s) on {profile.capture_metadata.sm_count} SMs",
        found, [f"underfilled_conv_kernels={len(found)}", f"underfilled_conv_time_ns={time_ns}",
                f"cudnn_benchmark={state}"],
        "With cuDNN's autotuner off, each convolution's algorithm comes from cuDNN's heuristics; these picks launch a "
        "few blocks that run long on a few SMs. torch.backends.cudnn.benchmark = True times the algorithms once per "
        "new input shape and keeps the fastest.",
    )
