"""Replay plan: from the nsys timeline, what the deduplicated ncu pass replays and what it cannot tell apart.

ncu's per-launch-config deduplication keys a launch on (mangled name, grid, block, shared memory) and replays
the first launch of each key. Launches of one key whose operator had other input shapes (a GEMM differing only
in K, a transposing copy, a convolution over more channels) are not identical: their counters differ. The plan
names the first launch of each such shape variant, and the ncu filter that replays them in a second pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from plugins.ncu.keys import ncu_config, operator_shapes
from plugins.nsys.reader import NsysWindow, read_window

# Measured on the H200 with the default metric set (plugins/ncu/metrics.yaml): 17 passes, about 25 ms each.
DEFAULT_PASSES = 17
SECONDS_PER_PASS = 0.025
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}")


@dataclass
class ReplayPlan:
    """What the deduplicated ncu pass replays, and the shape variants a second pass must replay."""

    launches: int = 0
    configurations: int = 0
    variants: list[int] = field(default_factory=list)  # launch ordinals
    variant_names: list[str] = field(default_factory=list)  # their mangled names, sorted
    launch_skip: int = 0  # in the numbering of the window's launches of those names
    launch_count: int = 0

    @property
    def kernel_regex(self) -> str:
        """An anchored regex matching exactly the variant kernels' mangled names."""
        return "^(" + "|".join(_escape(n) for n in self.variant_names) + ")$"

    def estimate_s(self, replays: int, passes: int = DEFAULT_PASSES) -> float:
        """Estimated replay time of `replays` kernels (an estimate: passes x the H200's time per pass)."""
        return replays * passes * SECONDS_PER_PASS


def plan_replays(sqlite: Path) -> ReplayPlan:
    """The replay plan of the window in an nsys SQLite export."""
    return read_window(sqlite, _plan)


def _plan(window: NsysWindow) -> ReplayPlan:
    plan = ReplayPlan()
    seen_shapes: dict[tuple[object, ...], set[str]] = {}
    kernels: list[tuple[int, str | None]] = []
    for kernel in window.kernels():
        plan.launches += 1
        kernels.append((kernel.ordinal, kernel.mangled_name))
        key = ncu_config(kernel)
        shapes = repr(operator_shapes(kernel))
        known = seen_shapes.get(key)
        if known is None:
            seen_shapes[key] = {shapes}
        elif shapes not in known:
            known.add(shapes)
            if kernel.mangled_name:  # ncu's filter names kernels by mangled name: none, no targeting
                plan.variants.append(kernel.ordinal)
    plan.configurations = len(seen_shapes)
    if plan.variants:
        wanted = set(plan.variants)
        plan.variant_names = sorted({name for ordinal, name in kernels if ordinal in wanted and name})
        names = set(plan.variant_names)
        numbering = [ordinal for ordinal, name in kernels if name in names]
        positions = [i for i, ordinal in enumerate(numbering) if ordinal in wanted]
        plan.launch_skip, plan.launch_count = positions[0], positions[-1] - positions[0] + 1
    return plan


def _escape(name: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in name)
