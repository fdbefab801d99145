"""The pass plan of one capture, as data: which passes run, which runner thread runs each, and the GPU's turns
between them (the window each waits for, the marker it writes once its window is done).

`plan_passes` is a pure function of what the capture asks; `schedule` runs the plan (threads, lock files,
processes). The turns: the no-profiler timing pass measures first (its host-sensitive windows never run beside
another pass's profiler stopping); then the main pass (torch.profiler, or nsys's timeline); then ncu's replay;
then the shape variants' replay. Passes after the first compiling one may warm up beside it where nothing
autotunes (eager, or Inductor from its cache); a pass whose early compile met a graph the cache lacked runs again,
beside the others once `retry_after`'s window is done (the cache then holds its graphs), else after its
`after`'s window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mcp_server.backend import Backend
from mcp_server.schema.types import COUNTER_PASS, TIMING_PASS, VARIANT_PASS, CompileMode, PassName

# Modes whose timing and ncu passes warm up beside the main pass: nothing in their warm-up autotunes when cuDNN's
# autotuner is off (the harness checks) and Inductor compiles from its cache only; the user's `optimize()` may.
EARLY_WARMUP_MODES = ("eager", "inductor", "cudagraphs")
TIMING_WINDOWS = 5  # the timing pass measures the window this many times
GRAPH_CAPTURE_MODES = ("eager", "optimized")  # where nsys's pass records the workload's own CUDA graph captures
BYTECODE: Literal["bytecode"] = "bytecode"  # the marker the bytecode precompile writes once it has ended

Marker = PassName | Literal["bytecode"]
Runner = Literal["main", "timing", "ncu"]


@dataclass(frozen=True)
class PlannedPass:
    """One pass of the plan."""

    name: PassName
    runner: Runner  # the thread that runs it; "main" runs the main pass, then the shape variants'
    locked: bool = True  # takes the run's GPU lock (a lone pass needs none)
    after: Marker | None = None  # compile, warm up and measure once this window is done
    done: PassName | None = None  # the marker it writes once its own window is done
    warm_up_early: bool = False  # warms up beside the previous pass; only its window waits for `after`
    retry_after: Marker | None = None  # a NotCached retry compiles beside the others once this window is done
    windows: int = 1
    warmup_iters: int | None = None  # overrides the workload's
    import_compiler_early: bool = False
    best_effort: bool = False  # its failure leaves the run going, said in the manifest
    started_after: tuple[Marker, ...] = ()  # a suspended pass's process starts once one of these exists
    suspended: bool = False  # started with the others under `ncu --mode launch`, attached once the plan is known
    record_graph_capture: bool = False  # nsys: CUDA graphs the workload captures are recorded with their ranges


def plan_passes(
    backend: Backend, *, counters: bool, whole_window: bool, timing: bool,
    compile_mode: CompileMode, warmup_iters: int, precompiling: bool, script: bool = False,
) -> list[PlannedPass]:
    """The passes of a capture in the order they take the GPU.

    `counters`: ncu replays the window (a backend with them); `whole_window`: ncu's default deduplicated replay, which a
    shape-variant pass completes; `timing`: a no-profiler timing pass runs (a GPU is here); `precompiling`: the
    bytecode precompile runs beside the passes (the timing pass measures once it has ended); `script`: a script
    run as it is, whose window is the steps after its warm-up, so every pass keeps the warm-up count.
    """
    main = backend.main_pass
    counters = counters and backend.counters
    several = timing or counters
    early = compile_mode in EARLY_WARMUP_MODES
    # A graph the workload captures itself (eager code, its own optimize()): its replays take the capture's ranges.
    # Inductor's own CUDA graphs are placed by its generated code instead.
    graphs = backend.records_graph_captures and compile_mode in GRAPH_CAPTURE_MODES
    plan: list[PlannedPass] = []
    if timing:
        plan.append(PlannedPass(TIMING_PASS, "timing", after=BYTECODE if precompiling else None, done=TIMING_PASS,
                                windows=TIMING_WINDOWS, best_effort=True))
    if several:
        plan.append(PlannedPass(main, "main", after=TIMING_PASS if timing else None, done=main,
                                warm_up_early=early and timing, record_graph_capture=graphs))
    else:
        plan.append(PlannedPass(main, "main", locked=False, record_graph_capture=graphs))
    if counters:
        plan.append(PlannedPass(COUNTER_PASS, "ncu", after=main, done=COUNTER_PASS, warm_up_early=early,
                                retry_after=TIMING_PASS if timing else None))
        if whole_window:
            # Only the compiled kernels are needed: one warm-up iteration compiles (CUDA-graph trees need more).
            plan.append(PlannedPass(
                VARIANT_PASS, "main", after=COUNTER_PASS,
                warmup_iters=warmup_iters if compile_mode == "cudagraphs" or script else min(warmup_iters, 1),
                import_compiler_early=True, suspended=True,
                started_after=(BYTECODE, main) if precompiling else ()))
    return plan


def gpu_order(plan: list[PlannedPass]) -> list[PassName]:
    """The passes in the order their windows take the GPU, read from the plan's markers (each waits for the one
    before it)."""
    done_by = {p.done: p for p in plan if p.done is not None}
    order: list[PassName] = []
    for p in plan:
        if p.after is None or p.after not in done_by:
            chain: PlannedPass | None = p
            while chain is not None and chain.name not in order:
                order.append(chain.name)
                chain = next((q for q in plan if q.after == chain.name), None)
    return order
