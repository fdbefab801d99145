"""The closed vocabularies of the tool, each defined once: every model, request and face uses these."""

from __future__ import annotations

from typing import Literal, get_args

CompileMode = Literal["eager", "inductor", "cudagraphs", "optimized"]
"""How the harness runs the model: as written, `torch.compile` (Inductor), `torch.compile(mode="reduce-overhead")`
(Inductor with CUDA graphs), or the workload's own `optimize(model)`."""

Backend = Literal["auto", "torch", "nsys"]
"""The profiler a capture asks for: `auto` chooses nsys (+ ncu) when an NVIDIA GPU, nsys and ncu are present."""

CaptureBackend = Literal["torch", "nsys+ncu", "memory"]
"""What a run directory was captured with (`nsys+ncu` holds the nsys pass, and ncu's once counters were added;
`memory` holds the memory pass alone)."""

RunMode = Literal["inference", "train_step"]
"""What one window iteration runs: a forward under `no_grad`, or the workload's `train_step(model, inputs)`."""

PassName = Literal["torch", "nsys", "ncu", "ncu_variants", "timing", "memory"]
"""A capture pass, and the sub-directory of the run directory holding its artifacts."""

COUNTER_PASS: PassName = "ncu"
"""The pass that replays the window's kernels under ncu for their hardware counters (a backend with `counters`)."""

Tier = Literal["exact", "reduced"]
"""Precision tier: `exact` keeps fp32 everywhere; `reduced` allows BF16/FP16/TF32 compute within a stated tolerance."""

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
BACKENDS: tuple[str, ...] = get_args(Backend)
TIERS: tuple[str, ...] = get_args(Tier)
STAGE_NAMES: tuple[str, ...] = get_args(StageName)
