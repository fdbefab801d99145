"""Join: match Nsight Compute's replayed kernels to the timeline's launches, in launch order."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import NamedTuple

from mcp_server.schema.profile import Metric
from mcp_server.schema.records import CounterRecord
from plugins.ncu.keys import LaunchLike, ncu_config, operator_shapes, same_work

Propagation = str | None  # "same_shapes", "same_work" or "nearest_shape" (a copy's reason); None: replayed itself
Counters = dict[int, tuple[dict[str, Metric], int | None, Propagation]]


class JoinResult(NamedTuple):
    """ordinal -> (metrics, propagated_from, propagation); disagreements between the captures; caveats on
    propagation."""

    counters: Counters
    problems: list[str]
    notes: list[str]


def join_counters(
    kernels: Sequence[LaunchLike],
    records: list[CounterRecord],
    deduplicated: bool,
    filtered: bool = False,
    variants: Sequence[CounterRecord] = (),
    start: int = 0,
    variants_start: int = 0,
    truncated: bool = False,
    variants_at: Sequence[int] | None = None,
) -> JoinResult:
    """Match ncu records to timeline kernels; return ordinal -> (metrics, propagated_from, propagation), mismatches,
    notes.

    ncu replays in launch order, so each record belongs to the next timeline launch, at or after the
    previous match, of the same kernel (mangled name, grid, block). Without deduplication or filters every
    launch must be matched in turn: a launch passed over is a disagreement between the captures and is
    reported. With per-launch-config deduplication, ncu replayed a launch only when it judged its
    configuration new (ncu's key: kernel name, grid, block, shared memory). `variants` are the records of the
    shape-variant pass (a filtered replay of the launches whose configuration ncu had seen with other input
    shapes): they join in launch order too. `start` and `variants_start` are the positions in `kernels` of the
    first launch each replay could match (see `launch_position`); `variants_at`, when the shape-variant pass
    profiled chosen module calls only, the launches it replayed, in order. Each launch still without counters gets
    those of a replayed launch of the same configuration, marked `propagated_from` with the reason: one whose
    operator had the same input shapes (the nearest in launch order, the earlier first), else the nearest
    measured shape (`shape_distance`); counters taken from a launch with other input shapes are named in the
    notes. Every record that matches no launch, and every
    launch left without counters, is reported, never papered over: as a note when the replay was `truncated`
    (stopped at its time limit or by --max-kernels), as a problem otherwise.
    """
    joined, problems = _match(kernels, records, deduplicated, filtered, start)
    notes: list[str] = []
    if problems and not filtered and _streams_known(kernels, records):
        by_stream, stream_problems = _match_per_stream(kernels, records, deduplicated)
        if (len(by_stream), -len(stream_problems)) > (len(joined), -len(problems)):  # matches more launches
            joined, problems = by_stream, stream_problems
            notes.append(
                "joined per CUDA stream: launches on several streams (e.g. from several host threads) came in "
                "another order under ncu than in the timeline; each stream's order matched"
            )
    if variants:
        wanted = set(variants_at) if variants_at is not None else None
        pool = kernels if wanted is None else [k for k in kernels if k.ordinal in wanted]
        extra, extra_problems = _match(pool, variants, deduplicated=False, filtered=True,
                                       start=variants_start if wanted is None else 0)
        if wanted is not None and len(extra) != len(wanted):
            extra_problems.append(f"it replayed {len(variants)} launches, {len(extra)} of the {len(wanted)} the plan "
                                  "named matched")
        joined.update(extra)
        problems += [f"shape-variant pass: {p}" for p in extra_problems]
    notes += _propagate(kernels, joined) if deduplicated else []
    if not filtered:
        missing = [k for k in kernels if k.ordinal not in joined]
        if missing and truncated:
            notes.append(
                f"{len(missing)} window launches have no ncu counters: ncu was stopped before it replayed them "
                f"(first: launch {missing[0].ordinal} {_short(missing[0].name)})"
            )
        elif missing:
            problems.append(
                f"{len(missing)} window launches have no ncu counters (first: launch {missing[0].ordinal} "
                f"{_short(missing[0].name)})"
            )
    return JoinResult(joined, problems, notes)


def launch_position(kernels: Sequence[LaunchLike], kernel_regex: str | None, launch_skip: int) -> int:
    """Where in `kernels` a replay filtered by `--kernel-name regex:` (on mangled names) and `--launch-skip`
    starts: the position of the (launch_skip + 1)-th matching launch (len(kernels) when there is none)."""
    pattern = re.compile(kernel_regex) if kernel_regex else None
    seen = 0
    for i, kernel in enumerate(kernels):
        if pattern is None or pattern.search(kernel.mangled_name or kernel.name):
            if seen == launch_skip:
                return i
            seen += 1
    return len(kernels)


def _match(
    kernels: Sequence[LaunchLike], records: Sequence[CounterRecord], deduplicated: bool, filtered: bool,
    start: int = 0, replayed_elsewhere: Sequence[CounterRecord] = (),
) -> tuple[Counters, list[str]]:
    """Each record onto the next launch of its kernel, in launch order from `start`; the disagreements found.

    A deduplicated replay may pass over a launch whose configuration it already replayed, or whose kernel one
    of `replayed_elsewhere` (another stream's records) replayed.
    """
    passed_over: list[str] = []
    unmatched: list[str] = []
    joined: Counters = {}
    position = start
    replayed_configs: set[tuple[object, ...]] = set()
    for record in records:
        j = position
        skipped: list[str] = []
        while j < len(kernels) and not _same_kernel(kernels[j], record):
            # Passing over a launch is expected only for a configuration ncu already replayed.
            seen = ncu_config(kernels[j]) in replayed_configs or any(
                _same_kernel(kernels[j], other) for other in replayed_elsewhere
            )
            if not filtered and not (deduplicated and seen):
                skipped.append(
                    f"launch {kernels[j].ordinal}: timeline ran {_short(kernels[j].name)}, "
                    f"ncu profiled {_short(record.name)} next"
                )
            j += 1
        if j == len(kernels):  # the launches scanned stay for the next record: none was passed over
            unmatched.append(f"ncu record {record.ordinal} ({_short(record.name)}) matches no later window launch")
            continue
        passed_over += skipped
        joined[kernels[j].ordinal] = (record.metrics, None, None)
        replayed_configs.add(ncu_config(kernels[j]))
        position = j + 1
    problems = [_summary(passed_over, "timeline launches were passed over"),
                _summary(unmatched, "ncu records match no later window launch")]
    return joined, [p for p in problems if p]


def _streams_known(kernels: Sequence[LaunchLike], records: Sequence[CounterRecord]) -> bool:
    """Both captures name every launch's CUDA stream, and more than one stream ran."""
    streams = {k.stream_id for k in kernels}
    return None not in streams and len(streams) > 1 and all(r.stream is not None for r in records)


def _match_per_stream(
    kernels: Sequence[LaunchLike], records: Sequence[CounterRecord], deduplicated: bool
) -> tuple[Counters, list[str]]:
    """`_match` within each CUDA stream, whose launch order both captures share whatever the host threads did.

    With deduplication, a launch may be passed over when ncu replayed its kernel on any stream.
    """
    joined: Counters = {}
    problems: list[str] = []
    streams = sorted({k.stream_id for k in kernels} | {r.stream for r in records}, key=str)
    replayed = list(records) if deduplicated else []
    for stream in streams:
        mine = [k for k in kernels if k.stream_id == stream]
        theirs = [r for r in records if r.stream == stream]
        found, trouble = _match(mine, theirs, deduplicated, filtered=False, replayed_elsewhere=replayed)
        joined.update(found)
        problems += [f"stream {stream}: {p}" for p in trouble]
    return joined, problems


def _summary(found: list[str], what: str) -> str:
    """One problem line for many of a kind: the first named, the rest counted."""
    if len(found) <= 1:
        return "".join(found)
    return f"{len(found)} {what}; first: {found[0]}"


def _propagate(kernels: Sequence[LaunchLike], joined: Counters) -> list[str]:
    """Copy counters to launches ncu passed over from the nearest replayed launch of the same configuration;
    return one note counting the launches whose counters come from a launch with other input shapes."""
    replayed: dict[tuple[object, ...], list[LaunchLike]] = {}
    for kernel in kernels:
        if kernel.ordinal in joined:
            replayed.setdefault(ncu_config(kernel), []).append(kernel)
    unlike: list[tuple[LaunchLike, LaunchLike]] = []
    for kernel in kernels:
        if kernel.ordinal in joined:
            continue
        sources = replayed.get(ncu_config(kernel))
        if not sources:
            continue
        shapes = operator_shapes(kernel)
        alike = [s for s in sources if operator_shapes(s) == shapes]
        if alike:
            earlier = [s for s in alike if s.ordinal < kernel.ordinal]
            source = earlier[-1] if earlier else alike[0]
        else:  # the nearest measured shape; of equals, the nearest launch, the earlier first
            source = min(sources, key=lambda s: (shape_distance(operator_shapes(s), shapes),
                                                 abs(s.ordinal - kernel.ordinal), s.ordinal > kernel.ordinal))
        reason = "same_shapes" if alike else (
            "same_work" if same_work(kernel.name, operator_shapes(source), shapes) else "nearest_shape")
        joined[kernel.ordinal] = (joined[source.ordinal][0], source.ordinal, reason)
        if operator_shapes(source) != shapes:
            unlike.append((kernel, source))
    if not unlike:
        return []
    alike_work = sum(1 for k, s in unlike if same_work(k.name, operator_shapes(s), operator_shapes(k)))
    unlike = [(k, s) for k, s in unlike if not same_work(k.name, operator_shapes(s), operator_shapes(k))]
    notes = [f"{alike_work} element-wise or layout-conversion launches carry the counters of a launch of their "
             "configuration whose operator had other shapes: the same work (the configuration, and for element-wise "
             "kernels the inputs' element counts, fix it)"] if alike_work else []
    if not unlike:
        return notes
    kernel, source = unlike[0]
    return notes + [
        f"{len(unlike)} launches carry the counters of a launch of their configuration with other input shapes "
        f"(first: launch {kernel.ordinal} {_short(kernel.name)} from launch {source.ordinal}: "
        f"{operator_shapes(source)}, not {operator_shapes(kernel)}); --no-dedupe replays each launch"
    ]


def shape_distance(a: list[list[int] | None] | None, b: list[list[int] | None] | None) -> float:
    """How far apart two launches' operator shapes are: over inputs of equal rank, the sum of |log| of each
    dimension's ratio (a KV length of 100 is nearer 90 than 50); a differing rank or input count weighs 100."""
    if a == b:
        return 0.0
    if a is None or b is None or len(a) != len(b):
        return 100.0
    total = 0.0
    for x, y in zip(a, b, strict=True):
        if x is None or y is None or len(x) != len(y):
            total += 0.0 if x == y else 100.0
            continue
        total += sum(abs(math.log((p + 1) / (q + 1))) for p, q in zip(x, y, strict=True))
    return total


def _short(name: str) -> str:
    return repr(name if len(name) <= 60 else name[:59] + "…")


def _same_kernel(kernel: LaunchLike, record: CounterRecord) -> bool:
    """Same function (mangled names when both tools give one) and, when both are known, same grid and block."""
    for mine, theirs in ((kernel.grid, record.grid), (kernel.block, record.block)):
        if mine is not None and theirs is not None and tuple(mine) != tuple(theirs):
            return False
    if kernel.mangled_name and record.mangled_name:
        return kernel.mangled_name == record.mangled_name
    return " ".join(kernel.name.split()) == " ".join(record.name.split())
