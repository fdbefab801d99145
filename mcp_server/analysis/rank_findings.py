"""The multi-rank part of a diagnosis: findings and changes from ranks.json, thresholds and changes from
knowledge/distributed.yaml.

Three findings. Communication-bound (communication not hidden by compute is a large share of the window) and poor
overlap (little of the communication runs beside compute) read the reference rank: the one that waited least for
the others inside its collectives, whose time in them is moving data, not waiting. The others' waiting is the
third finding's: stragglers (ranks the others wait for, from ranks.json; one the profiler alone made late is a
note, not a finding).

The times come from the ranks' profiled timelines. Estimates are bounded by what was measured without the
profiler where a timing pass exists (GPU runs): a share of the profiled window (exposed communication, or a
straggler's caused wait) applied to the window the timing pass measured. CPU runs have no such pass, and their
estimates say so.
"""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Any

from mcp_server.analysis.rules import KnowledgeError, knowledge
from mcp_server.schema.analysis import DistributedAnalysis, Finding, Opportunity, RankRow
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.ranks import RanksSummary, Straggler

KNOWLEDGE = "knowledge/distributed.yaml"


def _table() -> dict[str, Any]:
    return knowledge("distributed")


def _threshold(key: str) -> float:
    try:
        return float(_table()["thresholds"][key])
    except (KeyError, TypeError) as exc:
        raise KnowledgeError(f"{KNOWLEDGE} has no thresholds.{key}", "restore the threshold in that file") from exc


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def _rows(summary: RanksSummary) -> list[RankRow]:
    return [RankRow(rank=r.rank, window_ns=r.window_ns, compute_ns=r.compute_ns, communication_ns=r.communication_ns,
                    exposed_communication_ns=max(0, r.communication_ns - r.overlap_ns), overlap_pct=r.overlap_pct,
                    idle_ns=r.idle_ns) for r in summary.ranks]


def _pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def _scale(profile: OperatorAttributedProfile, window_ns: float) -> tuple[float, str]:
    """(the window an estimate's share applies to, what it is): the timing pass's when it exists."""
    w = profile.window
    if w.unprofiled_wall_time_ns:
        return float(w.unprofiled_wall_time_ns), (
            f"share of the profiled window applied to the window timed without the profiler "
            f"({_ms(w.unprofiled_wall_time_ns)}, rank {_rank(profile)})")
    return window_ns, ("measured under the profiler: this backend has no timing pass without it, so the "
                       "saving is a share of the profiled window")


def _rank(profile: OperatorAttributedProfile) -> int:
    info = profile.capture_metadata.distributed
    return info.rank if info is not None else 0


def _applies(when: str, profile: OperatorAttributedProfile) -> bool:
    info = profile.capture_metadata.distributed
    if when == "ddp":
        return info is not None and (bool(info.ddp_buckets) or info.wrapped_by == "ddp")
    if when == "fsdp":
        return any(op.operator_name.startswith("fsdp::") for op in profile.operators)
    if when == "nccl":
        return info is not None and info.backend == "nccl"
    return when == "any"


def distributed_analysis(summary: RanksSummary, profile: OperatorAttributedProfile, ranks_path: Path
                         ) -> tuple[DistributedAnalysis, list[Finding], list[Opportunity]]:
    """The multi-rank view, its findings and the knowledge file's changes that answer them (estimates, upper
    bounds, ranked by saving)."""
    rows = _rows(summary)
    reference = min(summary.ranks, key=lambda r: (r.waiting_ns, r.communication_ns, r.rank), default=None)
    row = next((r for r in rows if reference is not None and r.rank == reference.rank), None)
    window = float(row.window_ns) if row else 0.0
    comm = float(row.communication_ns) if row else 0.0
    exposed = float(row.exposed_communication_ns) if row else 0.0
    overlap = row.overlap_pct if row else None
    comm_pct, exposed_pct = _pct(comm, window), _pct(exposed, window)
    by_module = dict(sorted(reference.communication_by_module_ns.items(), key=lambda kv: -kv[1])) if reference else {}
    top_modules = [m for m in by_module if m != "(no module)"][:5]
    evidence = [f"communication_pct={comm_pct:.1f}", f"exposed_communication_pct={exposed_pct:.1f}",
                *([f"overlap_pct={overlap:.1f}"] if overlap is not None else []), f"world_size={summary.world_size}"]
    findings: list[Finding] = []
    if comm_pct >= _threshold("min_communication_pct"):
        if exposed_pct >= _threshold("communication_bound_exposed_pct"):
            findings.append(Finding(
                kind="communication_bound", title="communication-bound window", module_paths=top_modules,
                triggers=evidence,
                detail=f"on rank {row.rank if row else '?'} {exposed_pct:.1f} % of the window ({_ms(exposed)} of "
                       f"{_ms(window)}) is communication that no compute hides; collectives take {comm_pct:.1f} % in "
                       "all"))
        if overlap is not None and overlap < _threshold("poor_overlap_pct"):
            findings.append(Finding(
                kind="poor_overlap", title="communication barely overlaps compute", module_paths=top_modules,
                triggers=evidence,
                detail=f"{overlap:.1f} % of rank {row.rank if row else '?'}'s {_ms(comm)} of communication runs "
                       "beside compute"))
    for s in summary.stragglers:
        findings.append(Finding(
            kind="straggler", title=f"rank {s.rank} is a straggler", triggers=[
                f"caused_wait_ns={s.caused_wait_ns}", f"last_arrival_share_pct={s.last_arrival_share_pct:.1f}",
                f"mean_lateness_ns={s.mean_lateness_ns:.0f}"], detail=s.reason))
    notes = [f"rank {s.rank} looked like a straggler under the profiler only: {s.reason}"
             for s in summary.unconfirmed_stragglers]
    middle = median(r.window_ns for r in rows) if rows else 0.0
    late = max(summary.stragglers, key=lambda s: s.caused_wait_ns, default=None)
    caused = late.caused_wait_ns if late else 0
    shares = (_pct(exposed, window) / 100.0, _pct(caused, middle) / 100.0)  # a wait is a share of the median window
    scale, label = _scale(profile, middle)
    opportunities = _changes(findings, profile, shares, scale, label, top_modules, _wait_cap(late))
    verdict = next((f.kind for f in findings), "compute_bound")
    info = profile.capture_metadata.distributed
    view = DistributedAnalysis(
        world_size=summary.world_size, backend=info.backend if info else None, ranks_path=str(ranks_path),
        verdict=verdict, communication_pct=round(comm_pct, 2), exposed_communication_pct=round(exposed_pct, 2),
        overlap_pct=round(overlap, 2) if overlap is not None else None, skew_ns_max=summary.skew_ns_max,
        stragglers=[s.rank for s in summary.stragglers], communication_by_module_ns=by_module,
        times_source=f"each rank's profiled timeline ({profile.capture_metadata.tool}), merged in ranks.json",
        reference_rank=row.rank if row else None, ranks=rows, notes=notes)
    return view, findings, opportunities


def _wait_cap(late: Straggler | None) -> tuple[int, str] | None:
    """The least of what the measurements beside nsys allow straggler `late`'s wait to be (the timing pass's kernel
    trace, the others' room beside their compute without the profiler), with what it is; None without them."""
    if late is None:
        return None
    caps = [(late.traced_caused_wait_ns, "the wait in the timing pass's kernel trace"),
            (late.unprofiled_bound_ns, "the others' window timed without the profiler less their compute")]
    known = [(ns, what) for ns, what in caps if ns is not None]
    return min(known) if known else None


def _changes(findings: list[Finding], profile: OperatorAttributedProfile, shares: tuple[float, float], scale: float,
             label: str, modules: list[str], wait_cap: tuple[int, str] | None = None) -> list[Opportunity]:
    """The knowledge file's changes that answer `findings`, each saving a share of the window (`shares`: the exposed
    communication's, the straggler's caused wait's) applied to `scale`; a straggler's at most `wait_cap`."""
    kinds = {f.kind for f in findings}
    out = []
    for change in _table().get("changes", []):
        answers = [k for k in change["answers"] if k in kinds]
        if not answers or not _applies(str(change.get("when", "any")), profile):
            continue
        straggler = answers == ["straggler"]
        share = min(shares[1] if straggler else shares[0], 1.0)
        saving, capped = share * scale, ""
        if straggler and wait_cap is not None and scale and wait_cap[0] < saving:
            saving, share = float(max(0, wait_cap[0])), max(0, wait_cap[0]) / scale
            capped = f"; at most {_ms(wait_cap[0])}, {wait_cap[1]}"
        removed = "the waiting the straggler causes" if straggler else "the exposed communication"
        tier = f" ({change['tier']} tier: a precision change)" if change.get("tier") else ""
        out.append(Opportunity(
            rank=0, title=change["title"] + tier, change_class=change["id"],
            module_paths=[] if straggler else modules,
            triggers=[t for f in findings if f.kind in answers for t in f.triggers][:6],
            estimated_saving_ns=int(saving), estimated_saving_pct=100.0 * share,
            estimate_label=f"estimate, upper bound: all of {removed} removed; {label}{capped}",
            knowledge=f"{KNOWLEDGE}#{change['id']}: {change['how']}", findings=answers,
        ))
    return out


def merged(ours: list[Opportunity], theirs: list[Opportunity]) -> list[Opportunity]:
    """Both lists as one, ranked by estimated end-to-end saving."""
    ranked = sorted([*ours, *theirs], key=lambda o: -o.estimated_saving_ns)
    return [o.model_copy(update={"rank": i + 1}) for i, o in enumerate(ranked)]
