"""The vocabularies of the tool, each defined once: every model, request and face uses these. The closed ones are
Literals; backend and pass names are names by pattern, since the backend registry, not the schema, says which exist."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import StringConstraints

CompileMode = Literal["eager", "inductor", "cudagraphs", "optimized"]
"""How the harness runs the model: as written, `torch.compile` (Inductor), `torch.compile(mode="reduce-overhead")`
(Inductor with CUDA graphs), or the workload's own `optimize(model)`."""

NAME_PATTERN = r"^[a-z][a-z0-9_+]*$"
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
"""A backend's or a pass's name. Which backends exist is the registry's to say (`mcp_server.backends.registry`), not
the schema's: a backend added there is accepted here without a change."""

Backend = Name
"""The profiler a capture asks for: `auto` (the first backend of the registry this machine has everything for), or
a registered backend's name; `choose_backend` refuses any other."""

CaptureBackend = Name
"""What a run directory was captured with: a registered backend's label (`nsys+ncu` holds the nsys pass, and ncu's
once counters were added), or `memory` (the memory pass alone)."""

RunMode = Literal["inference", "train_step"]
"""What one window iteration runs: a forward under `no_grad`, or the workload's `train_step(model, inputs)`."""

PassName = Name
"""A capture pass, and the sub-directory of the run directory holding its artifacts: a registered backend's main
pass, or one of the passes every backend may plan (`SHARED_PASSES`)."""

TIMING_PASS: PassName = "timing"
"""The pass that times the window without the profiler (and traces its kernels for busy time and gaps)."""

COUNTER_PASS: PassName = "ncu"
"""The pass that replays the window's kernels under ncu for their hardware counters (a backend with `counters`)."""

VARIANT_PASS: PassName = "ncu_variants"
"""The counter pass's second half: the shape variants of the configurations the counter pass replayed (or, where the
configurations alone exceed the replay budget, those of the kernels holding the most time that it left)."""

SPLIT_NOTE = "stopped at the replay budget's split (--replay-budget):"
"""How a counter pass's note begins when it stopped at the count the replay budget's split set."""

MEMORY_PASS: PassName = "memory"
"""The memory pass: the CUDA caching allocator's history over the window (`memory`, or `profile --memory`)."""

SHARED_PASSES: tuple[PassName, ...] = (TIMING_PASS, COUNTER_PASS, VARIANT_PASS, MEMORY_PASS)
"""The passes that belong to no one backend; each backend's main pass is named by its adapter."""

MEMORY_LABEL: CaptureBackend = "memory"
"""The manifest's backend for a run directory that holds the memory pass alone."""

Tier = Literal["exact", "reduced", "fp8"]
"""Precision tier, tightest first: `exact` keeps fp32 everywhere; `reduced` allows BF16/FP16/TF32 compute within a
stated tolerance; `fp8` also FP8 GEMMs, within a looser one. A tier accepts what every tighter tier accepts."""

StageName = Literal[
    "preflight", "profile", "recipes", "propose", "implement", "validate", "reprofile", "compare", "bench", "report"
]
"""A stage of the `/optimize` loop, in order; `--from=<stage>` resumes at it."""

StageStatus = Literal["done", "missing", "stale", "failed"]
"""How a loop stage or checkpoint file stands: written and current; not written; computed from inputs that have
changed since; written, current, but a failed verdict (validation_report.json that did not pass)."""

Provenance = Literal["loop_state", "mtime"]
"""How a checkpoint's freshness was judged: from its record in loop_state.json (input hashes), or from
modification times (a file an agent wrote, or one whose record no longer matches it)."""

LoopTool = Literal["analyze", "recipes", "compare", "bench", "validate", "report"]
"""The engine tools that record the loop checkpoints they write in loop_state.json."""

COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
TIERS: tuple[str, ...] = get_args(Tier)


def tiers_within(tier: str) -> tuple[str, ...]:
    """The tiers whose results `tier` accepts: itself and every tighter one."""
    return TIERS[:TIERS.index(tier) + 1]
STAGE_NAMES: tuple[str, ...] = get_args(StageName)
