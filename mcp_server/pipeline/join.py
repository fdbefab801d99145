"""Join: match Nsight Compute's replayed kernels to the timeline's launches, in launch order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mcp_server.schema.profile import Metric
from mcp_server.schema.records import CounterRecord


class LaunchLike(Protocol):
    """What the ncu join reads of a timeline kernel."""

    ordinal: int
    name: str
    mangled_name: str | None
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None


def join_counters(
    kernels: Sequence[LaunchLike], records: list[CounterRecord], deduplicated: bool, filtered: bool = False
) -> tuple[dict[int, tuple[dict[str, Metric], int | None]], list[str]]:
    """Match ncu records to timeline kernels; return ordinal -> (metrics, propagated_from) and mismatches.

    ncu replays in launch order, so each record belongs to the next timeline launch, at or after the
    previous match, of the same kernel (mangled name, grid, block). Without deduplication or filters every
    launch must be matched in turn: a launch passed over is a disagreement between the captures and is
    reported. With per-launch-config deduplication, ncu replayed a launch only when it judged its
    configuration new; each launch it passed over gets the counters of the nearest replayed launch of the
    same configuration (the earlier one when there is one), marked `propagated_from`. Every record that
    matches no launch, and every launch left without counters, is reported, never papered over.
    """
    problems: list[str] = []
    joined: dict[int, tuple[dict[str, Metric], int | None]] = {}
    position = 0
    replayed_configs: set[tuple[object, ...]] = set()
    for record in records:
        j = position
        while j < len(kernels) and not _same_kernel(kernels[j], record):
            # Passing over a launch is expected only for a configuration ncu already replayed.
            if not filtered and not (deduplicated and _config(kernels[j]) in replayed_configs):
                problems.append(
                    f"launch {kernels[j].ordinal}: timeline ran {_short(kernels[j].name)}, "
                    f"ncu profiled {_short(record.name)} next"
                )
            j += 1
        if j == len(kernels):
            problems.append(f"ncu record {record.ordinal} ({_short(record.name)}) matches no later window launch")
            continue
        joined[kernels[j].ordinal] = (record.metrics, None)
        replayed_configs.add(_config(kernels[j]))
        position = j + 1
    if deduplicated:
        _propagate(kernels, joined)
    if not filtered:
        missing = [k for k in kernels if k.ordinal not in joined]
        if missing:
            problems.append(
                f"{len(missing)} window launches have no ncu counters (first: launch {missing[0].ordinal} "
                f"{_short(missing[0].name)})"
            )
    return joined, problems


def _propagate(kernels: Sequence[LaunchLike], joined: dict[int, tuple[dict[str, Metric], int | None]]) -> None:
    """Copy counters to launches ncu passed over from the nearest replayed launch of the same configuration."""
    replayed: dict[tuple[object, ...], list[int]] = {}
    for kernel in kernels:
        if kernel.ordinal in joined:
            replayed.setdefault(_config(kernel), []).append(kernel.ordinal)
    for kernel in kernels:
        if kernel.ordinal in joined:
            continue
        sources = replayed.get(_config(kernel))
        if sources:
            earlier = [s for s in sources if s < kernel.ordinal]
            source = earlier[-1] if earlier else sources[0]
            joined[kernel.ordinal] = (joined[source][0], source)


def _short(name: str) -> str:
    return repr(name if len(name) <= 60 else name[:59] + "…")


def _config(kernel: LaunchLike) -> tuple[object, ...]:
    return (kernel.mangled_name or kernel.name, kernel.grid, kernel.block)


def _same_kernel(kernel: LaunchLike, record: CounterRecord) -> bool:
    """Same function (mangled names when both tools give one) and, when both are known, same grid and block."""
    for mine, theirs in ((kernel.grid, record.grid), (kernel.block, record.block)):
        if mine is not None and theirs is not None and tuple(mine) != tuple(theirs):
            return False
    if kernel.mangled_name and record.mangled_name:
        return kernel.mangled_name == record.mangled_name
    return " ".join(kernel.name.split()) == " ".join(record.name.split())
