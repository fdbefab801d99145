"""The profiler's own graph break (torch only), kept in a module of its own so that the graph breaks a script's
compiles report (`compiling.SkippedFunctions`) can leave it out by its file.

Where Dynamo traces an optimizer's hooks (a step the script compiled: `Optimizer.profile_hook_step`'s wrapper loops
over them), a break there makes Dynamo run that wrapper eagerly: the hooks (the step counter, its profiler ranges) run
for real around the step's body, which Dynamo compiles as a frame of its own, as it does without the profiler."""

from __future__ import annotations


def run_hooks_eagerly() -> None:
    """Break Dynamo's graph here (a no-op where nothing is traced)."""
    import torch._dynamo

    torch._dynamo.graph_break()
