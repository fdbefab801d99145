"""The replay plan fitted to a budget of replay time: what ncu replays is bounded by the budget, not by the
workload (a decode loop's attention has new shapes at every step: thousands of shape variants).

Every configuration is replayed first (ncu's deduplicated pass: one replay each). What they leave pays for shape
variants, less the second pass's own warm-up under ncu (a decode loop's thousands of launches each pay ncu's
interception: about 10 s for an HF generate() call on an H200), taken by the module calls that launch them: calls of
each module path in a spread order (the first, the last, the middle, the quarters...) so that a few representative
steps of a decode loop are measured across its sequence lengths, paths holding more kernel time first. A variant left
out takes, at assembly, the counters of the nearest measured shape of its configuration (`propagated_from`,
propagation `nearest_shape`).

When the configurations alone exceed the budget, ncu could only replay them in launch order (a training step's
forward first, its backward left out), so the budget is split: the ncu pass replays the first configurations in
launch order and stops at a count, and the second pass replays, deduplicated, the configurations of the kernels
holding the most kernel time among the rest (ncu filters by kernel name); the split is the one covering the most
kernel time, and no shape variant is replayed.

A pure function of the plan: no process, no file.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mcp_server.capture.replay_plan import LaunchFacts, ReplayPlan

DEFAULT_BUDGET_S = 60.0
Call = tuple[str, int]  # (module path, its range's start)


def within_budget(plan: ReplayPlan, budget_s: float, seconds_each: float, start_s: float = 0.0,
                  replayed: int = 0, main_limit: int | None = None, split: bool = True) -> ReplayPlan:
    """`plan` fitted to `budget_s` seconds of replay at `seconds_each` per replayed kernel (a copy; `plan` is kept; a
    plan fitted before is fitted again from its `unfitted` plan). `start_s`: the seconds the second ncu pass
    takes to warm up under ncu before it replays, taken from what the configurations leave. `replayed`: the
    configurations the ncu pass has replayed by now (its stop cannot come before them); `main_limit`: the count it
    was told to stop at, when a plan fitted before split the configurations (kept: that pass is under way);
    `split` False: the ncu pass runs on to its budget whatever this plan says (a plan fitted before did not split
    it), so configurations beyond the budget are left to it and nothing else is replayed.

    The configurations come first; the variants' module calls (scoped plans) or the run of variant launches (the
    others) then take what is left, as described in the module's docstring."""
    plan = plan.unfitted or plan  # a fitted plan is fitted again from the plan it was fitted from
    fitted = replace(plan, budget_s=budget_s, seconds_each=seconds_each, start_s=start_s, left_out=[], unfitted=plan)
    affordable = max(1, math.floor(budget_s / seconds_each + 1e-9))  # 1e-9: 17.1 s / 0.3 s is 57
    start = math.ceil(start_s / seconds_each - 1e-9)  # the second pass's warm-up, in replays
    if plan.configurations > affordable and not split:
        fitted.main_limit = affordable
        return _without_variants(fitted)
    if plan.configurations > affordable or main_limit is not None:
        return _split_configurations(_without_variants(fitted), affordable, start, replayed, main_limit)
    if not plan.variants:
        return fitted
    room = max(0, affordable - plan.configurations - start)
    if plan.calls is None:
        return _run_prefix(fitted, room)
    return _spread_calls(fitted, room)


def refitted(plan: ReplayPlan, seconds_each: float | None, start_s: float | None = None,
             tolerance: float = 0.1) -> ReplayPlan:
    """`plan` fitted again to its budget at `seconds_each`, the pace the ncu pass was measured to replay at (a plan is
    first fitted at an estimate: the pass has not replayed enough kernels to measure its pace when the plan is made,
    and the pace varies with the workload: ncu restores every pinned host buffer before each pass, for one), and with
    the variant pass's warm-up `start_s` (None: the one it was fitted with); `plan` itself when neither is known to
    have moved by more than `tolerance` of the pace it was fitted at (a pace's worth, for the warm-up)."""
    fitted_at = plan.seconds_each
    if plan.budget_s is None or fitted_at is None:
        return plan
    pace = fitted_at if seconds_each is None else seconds_each
    start = plan.start_s if start_s is None else start_s
    if abs(pace - fitted_at) <= tolerance * fitted_at and abs(start - plan.start_s) <= pace:
        return plan
    fitted = within_budget(plan, plan.budget_s, pace, start, main_limit=plan.main_limit if plan.config_pass else None,
                           split=plan.config_pass)
    if plan.config_pass and not fitted.config_pass:
        return _second_pass_kept(plan, pace, start)
    return fitted


def _second_pass_kept(plan: ReplayPlan, seconds_each: float, start_s: float) -> ReplayPlan:
    """`plan`'s second pass kept past its budget, which at `seconds_each` and `start_s` leaves that pass no room: the
    ncu pass stops at the split `plan` set (it was told before its pace or the second pass's warm-up was measured),
    so without the second pass every configuration after the split would carry no counters at all.
    `past_budget_s` says by how much the two passes overrun the budget."""
    names = set(plan.variant_names)
    second = len({f.config for f in plan.launch_facts if f.mangled_name in names})
    cost = (plan.main_limit or 0) * seconds_each + start_s + second * seconds_each
    return replace(plan, seconds_each=seconds_each, start_s=start_s,
                   past_budget_s=max(0.0, cost - (plan.budget_s or 0.0)))


def _split_configurations(plan: ReplayPlan, affordable: int, start: int, replayed: int,
                          main_limit: int | None) -> ReplayPlan:
    """The configurations split between the ncu pass (the first `main_limit` in launch order, chosen here unless
    given) and the second pass (the configurations of whole kernels, by the kernel time they hold per replay, in the
    `affordable` replays left after the first pass's and the second pass's warm-up's `start`): the split covering
    the most kernel time. Without room for a second pass, the ncu pass replays what the budget affords."""
    first: dict[tuple[object, ...], int] = {}
    held: dict[tuple[object, ...], int] = {}
    named: dict[tuple[object, ...], str | None] = {}
    for facts in plan.launch_facts:
        first.setdefault(facts.config, facts.ordinal)
        named.setdefault(facts.config, facts.mangled_name)
        held[facts.config] = held.get(facts.config, 0) + facts.duration_ns
    order = sorted(first, key=first.__getitem__)
    replays_of: dict[str, int] = {}  # the second pass replays every configuration of a kernel it names
    for config in order:
        if (name := named[config]) is not None:
            replays_of[name] = replays_of.get(name, 0) + 1
    prefix = [0]
    for config in order:
        prefix.append(prefix[-1] + held[config])
    candidates = [main_limit] if main_limit is not None else range(min(max(replayed, 1), affordable), affordable + 1)
    best: tuple[int, int, list[str]] = (prefix[min(affordable, len(order))], affordable, [])
    for limit in candidates:  # of equal coverage, the longer first pass
        names = _kernels_by_time(order[limit:], held, named, replays_of, affordable - limit - start)
        covered = prefix[min(limit, len(order))] + sum(held[c] for c in order[limit:] if named[c] in names)
        if names and (covered, limit) > best[:2]:
            best = (covered, limit, names)
    limit, names = best[1], best[2]
    plan.main_limit = limit if names or main_limit is not None else affordable
    if not names:
        plan.unmeasured = max(0, len(order) - plan.main_limit)
        return plan
    chosen = set(names)
    plan.config_pass, plan.variant_names, plan.calls = True, sorted(chosen), None
    plan.variants = [first[c] for c in order[limit:] if named[c] in chosen]
    plan.unmeasured = sum(1 for c in order[limit:] if named[c] not in chosen)
    return plan


def _kernels_by_time(left: list[tuple[object, ...]], held: dict[tuple[object, ...], int],
                     named: dict[tuple[object, ...], str | None], replays_of: dict[str, int], room: int) -> list[str]:
    """The kernels whose configurations the second pass replays: by the kernel time their configurations in `left`
    hold per replay they cost (every configuration of the kernel in the window), while they fit `room` replays."""
    value: dict[str, int] = {}
    for config in left:
        if (name := named[config]) is not None:
            value[name] = value.get(name, 0) + held[config]
    chosen: list[str] = []
    for name in sorted(value, key=lambda n: (-value[n] / replays_of[n], n)):
        if replays_of[name] <= room:
            chosen.append(name)
            room -= replays_of[name]
    return chosen


def _without_variants(plan: ReplayPlan) -> ReplayPlan:
    plan.left_out = list(plan.variants)
    plan.variants, plan.variant_names, plan.replayed, plan.launch_skip, plan.launch_count = [], [], [], 0, 0
    plan.calls = None if plan.calls is None else []
    return plan


def _run_prefix(plan: ReplayPlan, room: int) -> ReplayPlan:
    """An unscoped plan replays a run of launches from the first variant: its first `room` launches."""
    if plan.launch_count <= room:
        return plan
    if room == 0:
        return _without_variants(plan)
    names = set(plan.variant_names)
    numbering = [f.ordinal for f in plan.launch_facts if f.mangled_name in names]
    covered = set(numbering[plan.launch_skip:plan.launch_skip + room])
    plan.left_out = [v for v in plan.variants if v not in covered]
    plan.variants = [v for v in plan.variants if v in covered]
    plan.launch_count = room
    return plan


def held_time(plan: ReplayPlan) -> dict[int, int]:
    """Kernel time each variant's counters stand for: its own, and that of the later launches of its configuration
    with its shapes (they copy its counters)."""
    by_ordinal = {f.ordinal: f for f in plan.launch_facts}
    owner: dict[tuple[object, ...], int] = {}
    held: dict[int, int] = {}
    wanted = set(plan.variants)
    for facts in plan.launch_facts:
        key = (facts.config, facts.shapes)
        if facts.ordinal in wanted:
            owner[key] = facts.ordinal
            held[facts.ordinal] = facts.duration_ns
        elif key in owner:
            held[owner[key]] += facts.duration_ns
    return {v: held.get(v, by_ordinal[v].duration_ns if v in by_ordinal else 0) for v in plan.variants}


def variant_share(plan: ReplayPlan) -> float:
    """The share of the window's kernel time the plan's variants' counters stand for (`held_time`), 0 to 1."""
    total = sum(f.duration_ns for f in plan.launch_facts)
    return sum(held_time(plan).values()) / total if total else 0.0


def spread_order(count: int) -> list[int]:
    """0..count-1 in the order that spreads them over the range: first, last, then the midpoints of the widest
    gaps (0, 8, 4, 2, 6, 1, 3, 5, 7 for 9)."""
    if count <= 0:
        return []
    order, seen = [0], {0}
    if count > 1:
        order.append(count - 1)
        seen.add(count - 1)
    gaps = [(0, count - 1)]
    while gaps and len(order) < count:
        widest = []
        for low, high in gaps:
            if high - low > 1:
                middle = (low + high) // 2
                if middle not in seen:
                    order.append(middle)
                    seen.add(middle)
                widest += [(low, middle), (middle, high)]
        gaps = widest
    return order + [i for i in range(count) if i not in seen]


def _spread_calls(plan: ReplayPlan, room: int) -> ReplayPlan:
    """A scoped plan: the variants' module calls, taken in spread order path by path while they fit `room`
    replayed launches."""
    facts = plan.launch_facts
    held = held_time(plan)
    innermost = {f.ordinal: f.calls[-1] for f in facts if f.ordinal in held and f.calls}
    value: dict[Call, int] = {}
    for variant, call in innermost.items():
        value[call] = value.get(call, 0) + held[variant]
    paths: dict[str, list[Call]] = {}
    for call in sorted(value, key=lambda c: c[1]):
        paths.setdefault(call[0], []).append(call)
    weight = {path: sum(value[c] for c in calls) for path, calls in paths.items()}
    ranked = []
    for path, calls in paths.items():
        for rank, index in enumerate(spread_order(len(calls))):
            ranked.append((rank, -weight[path], calls[index][1], calls[index]))
    threads = {f.thread for f in facts if f.ordinal in held}
    inside: dict[Call, list[LaunchFacts]] = {}
    for f in facts:
        if f.thread in threads:
            for call in f.calls:
                if call in value:
                    inside.setdefault(call, []).append(f)
    names_of = {call: {f.mangled_name for f in facts if innermost.get(f.ordinal) == call} for call in value}
    chosen: list[Call] = []
    names: set[str | None] = set()
    replayed: set[int] = set()
    for *_, call in sorted(ranked):
        more_names = names | names_of[call]
        added = {f.ordinal for c in [*chosen, call] for f in inside.get(c, []) if f.mangled_name in more_names}
        if len(replayed | added) > room:
            continue
        chosen.append(call)
        names, replayed = more_names, replayed | added
    kept = set(chosen)
    plan.left_out = [v for v in plan.variants if innermost.get(v) not in kept]
    plan.variants = [v for v in plan.variants if innermost.get(v) in kept]
    if not plan.variants:
        return _without_variants(replace(plan, variants=plan.variants + plan.left_out))
    every = _every_call(facts, threads)
    number = {path: sorted(c[1] for c in every if c[0] == path) for path in paths}
    plan.calls = sorted((path, number[path].index(start)) for path, start in chosen)
    plan.variant_names = sorted(n for n in names if n)
    plan.replayed = sorted(replayed)
    return plan


def _every_call(facts: list[LaunchFacts], threads: set[int | None]) -> set[Call]:
    """Every module call enclosing a launch of `threads` (the numbering the harness counts calls in)."""
    return {call for f in facts if f.thread in threads for call in f.calls}


def budget_note(plan: ReplayPlan) -> str | None:
    """What the budget left out, in one line (None when everything fits)."""
    if plan.budget_s is None or plan.seconds_each is None:
        return None
    seconds_each = plan.seconds_each
    if plan.config_pass:
        return (f"replay budget {plan.budget_s:.0f} s: the {plan.configurations} configurations alone need about "
                f"{plan.configurations * seconds_each:.0f} s, so the ncu pass replays the first {plan.main_limit} in "
                f"launch order and a second pass the {len(plan.variants)} left of {len(plan.variant_names)} kernels "
                f"holding the most kernel time ({100 * variant_share(plan):.1f} % of the window's); "
                f"{plan.unmeasured} carry no counters, and no shape variant is replayed (raise --replay-budget)"
                + (f"; at the pace and warm-up measured since, the two passes run about {plan.past_budget_s:.0f} s "
                   "past the budget: the ncu pass was told to stop at its split, and without the second pass the "
                   "configurations after it would carry no counters" if plan.past_budget_s >= 0.5 else ""))
    if plan.main_limit is not None:
        return (f"replay budget {plan.budget_s:.0f} s: the {plan.configurations} configurations alone need about "
                f"{plan.configurations * seconds_each:.0f} s, so ncu replays them in launch order until its replay "
                f"time reaches the budget (about the first {plan.main_limit}) and no shape variant; the rest carry no "
                "counters (raise --replay-budget)")
    if not plan.left_out:
        return None
    steps = f" in {len(plan.calls)} module calls spread over the window" if plan.calls is not None else ""
    warm = (f" (the second ncu pass's warm-up under ncu, about {plan.start_s:.0f} s, is paid from "
            "the budget)" if plan.start_s >= 0.5 else "")
    return (f"replay budget {plan.budget_s:.0f} s: {len(plan.variants)} of {len(plan.variants) + len(plan.left_out)} "
            f"shape variants are replayed{steps}{warm}; the other {len(plan.left_out)} take the counters of the "
            "nearest measured shape of their configuration (raise --replay-budget to measure more)")
