"""The stages of the `/optimize` loop and the checkpoint files each reads and writes: the one table of them.

skills/optimize/references/loop-state.md prints the same table (a test holds the two together). File names are
as they lie in the workload's folder; `{name}` stands for the workload's stem (`NAME` in the skill's texts).
"""

from __future__ import annotations

from typing import NamedTuple

from mcp_server.schema.types import StageName

WORKLOAD = "{name}.py"
OPTIMIZED = "{name}_optimized.py"
OPTIMIZED_TEST = "test_{name}_optimized.py"
PROFILE = "profile.json"
ANALYSIS = "analysis.json"
OPTIMIZATIONS = "optimizations.json"
PROPOSAL = "proposal.md"
IMPLEMENTATION = "implementation.md"
VALIDATION = "validation_report.json"
PROFILE_OPTIMIZED = "profile_optimized.json"
COMPARISON_JSON = "comparison.json"
COMPARISON_MD = "comparison.md"
BENCH = "bench.json"
RECIPES = "recipes.json"
BENCH_VS_FREE = "bench_vs_free.json"
REPORT = "report.md"
OPTIMIZED_WORKLOAD = "OPTIMIZED_WORKLOAD.md"


class Stage(NamedTuple):
    """One stage: the files it is computed from, the checkpoint files it writes (in the order it writes them),
    and, for a stage whose checkpoint holds a verdict, the stage that fixes a failed one."""

    name: StageName
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    on_failure: StageName | None = None


STAGES: tuple[Stage, ...] = (
    Stage("preflight", (), ()),
    Stage("profile", (WORKLOAD,), (PROFILE, ANALYSIS)),
    # the free frontier, measured on this GPU: the plan starts from its winner and must beat it
    Stage("recipes", (WORKLOAD,), (RECIPES,)),
    Stage("propose", (PROFILE, ANALYSIS, RECIPES), (OPTIMIZATIONS, PROPOSAL, IMPLEMENTATION)),
    # the brief, not the plan: the implement stage itself marks the plan's items implemented or deferred, and a
    # changed plan makes the brief stale (propose) before it can reach here
    Stage("implement", (IMPLEMENTATION,), (OPTIMIZED, OPTIMIZED_TEST)),
    Stage("validate", (WORKLOAD, OPTIMIZED, OPTIMIZED_TEST), (VALIDATION,), on_failure="implement"),
    Stage("reprofile", (OPTIMIZED,), (PROFILE_OPTIMIZED,)),
    Stage("compare", (PROFILE, PROFILE_OPTIMIZED), (COMPARISON_JSON, COMPARISON_MD)),
    # validate runs again with bench.json: validation_report.json, rewritten, then holds the checked speedup
    Stage("bench", (WORKLOAD, OPTIMIZED, RECIPES), (BENCH, BENCH_VS_FREE, VALIDATION)),
    Stage("report", (PROFILE, ANALYSIS, RECIPES, OPTIMIZATIONS, VALIDATION, PROFILE_OPTIMIZED, COMPARISON_JSON, BENCH,
                     BENCH_VS_FREE), (REPORT, OPTIMIZED_WORKLOAD)),
)

# The checkpoints the engine's tools write (and record in loop_state.json); the others are written by the agents.
RECORDED: frozenset[str] = frozenset({
    ANALYSIS, RECIPES, PROPOSAL, IMPLEMENTATION, VALIDATION, COMPARISON_JSON, COMPARISON_MD, BENCH, BENCH_VS_FREE,
    REPORT, OPTIMIZED_WORKLOAD,
})


def file_name(template: str, name: str) -> str:
    """A table entry as the file of workload stem `name`: `{name}_optimized.py` -> `conv_block_optimized.py`."""
    return template.format(name=name)


def first_writer(template: str) -> int:
    """The index in STAGES of the first stage that writes `template` (a later one writing it again rewrites it)."""
    return next(i for i, stage in enumerate(STAGES) if template in stage.writes)


def stage_index(name: str) -> int:
    """The index in STAGES of the stage called `name`."""
    return next(i for i, stage in enumerate(STAGES) if stage.name == name)
