"""Progress: the one-line sink every long engine call reports its phases and its children's output to.

A phase line says what the engine does next; every other line is a child's output (the workload's prints,
nsys's and ncu's own). Faces show phase lines always and children's output as they choose.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Progress = Callable[[str], None]

# Lines that start a phase, as the engine prints them: "torch.profiler pass: ...", "[nsys] nsys pass: ...",
# "assembling profile.json" (assembly), "operator_profiler_measure: timing: ..." (a measurement child), "validate:
# running ..." (validate), "ncu: ... replayed" (the replay plan), and each verb's own "<verb>: ..." lines.
PHASE_LINE = re.compile(
    r"^(?:\[\w+\] )?(?:[\w.]+ pass: |assembling |operator_profiler_measure: |validate: |(?:profile|map|assemble|"
    r"analyze|compare|bench|recipes|validate|report|preflight|query|ncu): )"
)


def quiet(_: str) -> None:
    """The progress sink that drops every line."""


def tagged(name: str, progress: Progress) -> Progress:
    """A sink that prefixes each line with `[name] ` (passes running side by side)."""
    return lambda line: progress(f"[{name}] {line}")


def is_phase(line: str) -> bool:
    """Whether `line` starts a phase of the engine's work (else it is a child's output)."""
    return bool(PHASE_LINE.match(line))
