"""Replay plan: from the nsys timeline, what the deduplicated ncu pass replays and what it cannot tell apart.

ncu's per-launch-config deduplication keys a launch on (mangled name, grid, block, shared memory) and replays
the first launch of each key. Launches of one key whose operator had other input shapes (a GEMM differing only
in K, a transposing copy, a convolution over more channels) are not identical: their counters differ. The plan
names the first launch of each such shape variant, and how a second pass replays them:

- *scoped* (eager windows, where every variant runs inside a module's range): the pass turns profiling on only
  during the module calls that launch a variant (`calls`: path and call number in the window) and replays the
  variant kernels' launches there — `replayed` lists them, the variants and any launch of their kernels inside
  those calls;
- otherwise, the contiguous run of the variant kernels' launches from the first variant to the last
  (`launch_skip`, `launch_count`).

A variant of a kernel whose work its launch configuration fixes is no variant: an element-wise kernel over
inputs of the same element counts (`[32, 256, 56, 56]` and `[32, 64, 112, 112]`) runs the same threads over
the same bytes (`plugins.ncu.keys.SAME_WORK_KERNELS`), and a cuDNN layout conversion's grid tiles the one tensor
it converts (`plugins.ncu.keys.CONFIG_FIXED_WORK_KERNELS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mcp_server.children.contract import MODULE_RANGE_PREFIX
from plugins.ncu.command import is_collective
from plugins.ncu.keys import ncu_config, operator_shapes, same_work
from plugins.nsys.ranges import NvtxRange
from plugins.nsys.reader import NsysWindow, WindowKernel, read_window

# The default metric set (plugins/ncu/metrics.yaml) takes 12 passes per kernel on an H100, about 25 ms each there
# and on the H200 (docs/measurements/h100_ncu_throughput_inputs.json: 0.296 s per replayed kernel).
DEFAULT_PASSES = 12
SECONDS_PER_PASS = 0.025
_REGEX_SPECIAL = set("\\^$.|?*+()[]{}")


@dataclass(frozen=True)
class LaunchFacts:
    """What the replay plan and its budget know of one window launch."""

    ordinal: int
    config: tuple[object, ...]  # ncu's per-launch-config key
    shapes: str  # its operator's input shapes, as text
    dims: list[list[int] | None] | None
    duration_ns: int
    mangled_name: str | None
    thread: int | None
    calls: tuple[tuple[str, int], ...]  # the module calls enclosing it, outermost first: (path, range start)


@dataclass
class ReplayPlan:
    """What the deduplicated ncu pass replays, and the shape variants a second pass must replay."""

    launches: int = 0
    configurations: int = 0
    variants: list[int] = field(default_factory=list)  # launch ordinals
    variant_names: list[str] = field(default_factory=list)  # their mangled names, sorted
    launch_skip: int = 0  # in the numbering of the window's launches of those names
    launch_count: int = 0
    calls: list[tuple[str, int]] | None = None  # scoped: (module path, call number in the window)
    replayed: list[int] = field(default_factory=list)  # scoped: the launch ordinals the pass replays
    same_work: int = 0  # shape variants left out: the launch configuration fixes their work
    launch_facts: list[LaunchFacts] = field(default_factory=list, repr=False)
    # set by `capture.budget.within_budget`:
    budget_s: float | None = None  # seconds of replay the plan was fitted to
    seconds_each: float | None = None  # the cost of one replayed kernel it was fitted with
    start_s: float = 0.0  # the shape-variant pass's warm-up under ncu, taken from the budget (an estimate)
    main_limit: int | None = None  # the configurations the budget affords, when they alone exceed it (an estimate)
    # when they do, the ncu pass replays `main_limit` in launch order and the second pass the configurations of
    # `variant_names` (deduplicated), the kernels holding the most time left: `variants` are those configurations'
    # first launches; `unmeasured` counts the configurations neither replays
    config_pass: bool = False
    unmeasured: int = 0
    past_budget_s: float = 0.0  # a second pass kept past the budget: the ncu pass was told to stop at its split
    left_out: list[int] = field(default_factory=list)  # variants not replayed: they take the nearest measured shape
    unfitted: ReplayPlan | None = field(default=None, repr=False, compare=False)  # the plan before it was fitted

    @property
    def kernel_regex(self) -> str:
        """An anchored regex matching exactly the variant kernels' mangled names."""
        return "^(" + "|".join(_escape(n) for n in self.variant_names) + ")$"

    def estimate_s(self, replays: int, passes: int = DEFAULT_PASSES) -> float:
        """Estimated replay time of `replays` kernels (an estimate: passes x the measured time per pass)."""
        return replays * passes * SECONDS_PER_PASS


def plan_replays(sqlite: Path) -> ReplayPlan:
    """The replay plan of the window in an nsys SQLite export."""
    return read_window(sqlite, _plan)


def _plan(window: NsysWindow) -> ReplayPlan:
    return plan_launches(window.kernels())


def plan_launches(kernels: Iterable[WindowKernel]) -> ReplayPlan:
    """The replay plan of a window's launches, in launch order."""
    plan = ReplayPlan()
    seen_shapes: dict[tuple[object, ...], set[str]] = {}
    first_shapes: dict[tuple[object, ...], list[list[int] | None] | None] = {}
    launches: list[WindowKernel] = []
    for kernel in kernels:
        plan.launches += 1
        launches.append(kernel)
        key = ncu_config(kernel)
        dims = operator_shapes(kernel)
        shapes = repr(dims)
        plan.launch_facts.append(LaunchFacts(kernel.ordinal, key, shapes, dims, kernel.duration_ns,
                                             kernel.mangled_name, kernel.launch_thread,
                                             tuple(_module_calls(kernel))))
        known = seen_shapes.get(key)
        if known is None:
            seen_shapes[key], first_shapes[key] = {shapes}, dims
        elif shapes not in known:
            known.add(shapes)
            if same_work(kernel.name, first_shapes[key], dims):
                plan.same_work += 1
            # ncu's filter names kernels by mangled name: none, no targeting; a collective's is never replayed
            elif kernel.mangled_name and not is_collective(kernel.mangled_name):
                plan.variants.append(kernel.ordinal)
    plan.configurations = len(seen_shapes)
    if plan.variants:
        wanted = set(plan.variants)
        plan.variant_names = sorted({k.mangled_name for k in launches if k.ordinal in wanted and k.mangled_name})
        names = set(plan.variant_names)
        numbering = [k.ordinal for k in launches if k.mangled_name in names]
        positions = [i for i, ordinal in enumerate(numbering) if ordinal in wanted]
        plan.launch_skip, plan.launch_count = positions[0], positions[-1] - positions[0] + 1
        _scope(plan, launches, wanted, names)
    return plan


def _module_path(frame: NvtxRange) -> str | None:
    """The path a harness module range (`module:<path>`) names; None for any other range (FSDP's unit ranges
    are modules to attribution, but the harness counts calls of the model's own modules only)."""
    return frame.text[len(MODULE_RANGE_PREFIX):] if frame.text.startswith(MODULE_RANGE_PREFIX) else None


def _module_calls(kernel: WindowKernel) -> list[tuple[str, int]]:
    """The module calls enclosing a launch, outermost first: (path, its range's start)."""
    return [(path, frame.start_ns) for frame in kernel.stack if (path := _module_path(frame)) is not None]


def _scope(plan: ReplayPlan, launches: list[WindowKernel], wanted: set[int], names: set[str]) -> None:
    """The module calls holding the variants, when they run on one thread and those inside a module call hold most
    of the variants' kernel time (a variant outside every module call, a decode loop's `torch.cat` of the new token,
    cannot be scoped: it is left out of a scoped plan and takes the nearest measured shape's counters)."""
    threads = {k.launch_thread for k in launches if k.ordinal in wanted}
    variants = [(k.duration_ns, _module_calls(k)) for k in launches if k.ordinal in wanted]
    enclosing = [calls for _, calls in variants if calls]
    inside = sum(duration for duration, calls in variants if calls)
    if len(threads) != 1 or not enclosing or 2 * inside < sum(duration for duration, _ in variants):
        return
    starts: dict[str, set[int]] = {}  # every call of each module in the window, by its range's start
    for kernel in launches:
        if kernel.launch_thread in threads:
            for path, start in _module_calls(kernel):
                starts.setdefault(path, set()).add(start)
    chosen = {calls[-1] for calls in enclosing}  # each variant's innermost module call
    numbered = {path: sorted(found) for path, found in starts.items()}
    plan.calls = sorted((path, numbered[path].index(start)) for path, start in chosen)
    plan.replayed = [k.ordinal for k in launches if k.mangled_name in names and k.launch_thread in threads
                     and not chosen.isdisjoint(_module_calls(k))]


def _escape(name: str) -> str:
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in name)
