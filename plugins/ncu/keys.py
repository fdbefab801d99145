"""What ncu's per-launch-config filter keys a launch on, and what that key cannot tell apart (input shapes).

Shared by the replay plan (which launches a shape-variant pass replays) and the join (which launch a replayed
kernel's counters belong to, and which launches get copies of them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Protocol


class LaunchLike(Protocol):
    """What the ncu join reads of a timeline kernel."""

    @property
    def ordinal(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def mangled_name(self) -> str | None: ...
    @property
    def stream_id(self) -> int | None: ...
    @property
    def grid(self) -> tuple[int, int, int] | None: ...
    @property
    def block(self) -> tuple[int, int, int] | None: ...
    @property
    def shared_memory_bytes(self) -> int | None: ...
    @property
    def stack(self) -> Sequence[FrameLike]: ...


class FrameLike(Protocol):
    """What the join reads of an enclosing NVTX range: the recorded input shapes of its operator."""

    @property
    def input_shapes(self) -> list[list[int] | None] | None: ...


# PyTorch's element-wise kernels over contiguous inputs: their launch configuration and their inputs' element
# counts fix their work (the same threads over the same bytes), so two launches of one configuration over inputs
# of equal element counts, input by input, have the same counters whatever the shapes.
SAME_WORK_KERNELS = re.compile(r"\b(?:vectorized|unrolled)_elementwise_kernel<")
# cuDNN's layout conversions around its NHWC tensor-core kernels: their grid tiles the one tensor they convert, so
# their launch configuration alone fixes their work, whatever the operator's other inputs (a convolution over the
# same activation with other weights converts the same activation). Measured on the H100 (ResNet-50, eager):
# launches of one configuration from convolutions of other shapes had the same instruction count and DRAM reads
# (docs/measurements/h100_variant_replay.json).
CONFIG_FIXED_WORK_KERNELS = re.compile(r"\bcudnn::engines_precompiled::(?:nchwToNhwc|nhwcToNchw)Kernel<")


def ncu_config(kernel: LaunchLike) -> tuple[object, ...]:
    """ncu's per-launch-config key of a launch: (mangled name, grid, block, shared memory)."""
    return (kernel.mangled_name or kernel.name, kernel.grid, kernel.block, kernel.shared_memory_bytes)


def operator_shapes(kernel: LaunchLike) -> list[list[int] | None] | None:
    """A launch's input shapes: those of the innermost enclosing operator range that recorded any."""
    for frame in reversed(kernel.stack):
        if frame.input_shapes is not None:
            return frame.input_shapes
    return None


def same_work(name: str, first: list[list[int] | None] | None, other: list[list[int] | None] | None) -> bool:
    """True for launches of one configuration that do the same work whatever their shapes: a cuDNN layout
    conversion (`CONFIG_FIXED_WORK_KERNELS`), or an element-wise kernel (`SAME_WORK_KERNELS`) whose operator's
    inputs hold as many elements, input by input."""
    if CONFIG_FIXED_WORK_KERNELS.search(name):
        return True
    if not SAME_WORK_KERNELS.search(name) or first is None or other is None or len(first) != len(other):
        return False
    return all((a is None) == (b is None) and (a is None or b is None or math.prod(a) == math.prod(b))
               for a, b in zip(first, other, strict=True))
