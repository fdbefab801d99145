"""The diagnosis in words: per-stage rows, the window's bottleneck with its root cause, CPU-only analyses and
the compact terminal summary (`format_summary`)."""

from __future__ import annotations

from collections import Counter, defaultdict

from mcp_server.analysis.classify import kernel_issue
from mcp_server.analysis.pattern_registry import PATTERNS
from mcp_server.analysis.rank_findings import KNOWLEDGE as DISTRIBUTED_KNOWLEDGE
from mcp_server.analysis.rules import rule
from mcp_server.analysis.syncs import idle_wording
from mcp_server.assemble.torch_profiler import window_outside_operators
from mcp_server.schema.analysis import (
    Analysis,
    Bottleneck,
    Configuration,
    CpuHotspot,
    Diagnosis,
    KernelAnalysis,
    OperatorAnalysis,
    StageRow,
    TimelineHealth,
)
from mcp_server.schema.profile import OperatorAttributedProfile

STAGES = 12
SUMMARY_STAGES = 8
NO_GPU = "No GPU data exists: CUDA was not available to the workload, so the profile holds CPU operator times only."


def _us(ns: float | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _weighted(kernels: list[KernelAnalysis], field: str) -> float | None:
    pairs = [(getattr(k, field), max(k.duration_ns, 1)) for k in kernels if getattr(k, field) is not None]
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None


def stage_rows(operators: list[OperatorAnalysis], kernels: list[KernelAnalysis], limit: int = STAGES) -> list[StageRow]:
    """Operators grouped by module path (operator name when none) and, in a training step, by phase (forward work
    activation checkpointing runs again in the backward apart); longest first."""
    phased = len({op.phase for op in operators}) > 1
    groups: dict[tuple[str, str | None, str | None], list[OperatorAnalysis]] = {}
    for op in operators:
        phase = op.phase if phased else None
        shown = f"{phase}, recomputed" if phase and op.recomputed else phase
        label = (op.module_path or op.operator_name) + (f" ({shown})" if shown else "")
        groups.setdefault((label, op.module_path, phase), []).append(op)
    by_op: dict[str, list[KernelAnalysis]] = {}
    for k in kernels:
        by_op.setdefault(k.operator_id or "", []).append(k)
    unattributed = by_op.get("", [])
    total = sum(k.duration_ns for k in kernels) or 1
    rows = []
    for (label, module, phase), ops in groups.items():
        mine = [k for op in ops for k in by_op.get(op.operator_id, [])]
        time: Counter[Bottleneck] = Counter()
        for k in mine:
            time[k.bottleneck] += k.duration_ns
        longest = max(ops, key=lambda o: o.duration_ns)
        duration = sum(k.duration_ns for k in mine)
        rows.append(StageRow(
            label=label, module_path=module, phase=phase, operators=[o.operator_id for o in ops],
            kernel_count=len(mine), duration_ns=duration,
            share_of_kernel_time_pct=100.0 * duration / total, tensor_pipe_pct=_weighted(mine, "tensor_pipe_pct"),
            dram_throughput_pct=_weighted(mine, "dram_throughput_pct"),
            achieved_occupancy_pct=_weighted(mine, "achieved_occupancy_pct"),
            bottleneck=time.most_common(1)[0][0] if time else Bottleneck.UNKNOWN, key_issue=longest.key_issue,
        ))
    if unattributed:
        duration = sum(k.duration_ns for k in unattributed)
        rows.append(StageRow(label="(unattributed)", kernel_count=len(unattributed), duration_ns=duration,
                             share_of_kernel_time_pct=100.0 * duration / total,
                             tensor_pipe_pct=_weighted(unattributed, "tensor_pipe_pct"),
                             dram_throughput_pct=_weighted(unattributed, "dram_throughput_pct"),
                             achieved_occupancy_pct=_weighted(unattributed, "achieved_occupancy_pct")))
    return sorted(rows, key=lambda r: -r.duration_ns)[:limit]


def _lead(cls: Bottleneck, kernels: list[KernelAnalysis], operators: list[OperatorAnalysis]) -> str:
    """", led by <operator> (<module>): <issue>": the operator with the most kernel time of class `cls`, and the
    issue of its longest kernel of that class (an operator's own longest kernel may be of another class)."""
    mine: dict[str, list[KernelAnalysis]] = {}
    for k in kernels:
        if k.bottleneck == cls and k.operator_id:
            mine.setdefault(k.operator_id, []).append(k)
    if not mine:
        return ""
    op_id, ks = max(mine.items(), key=lambda item: sum(k.duration_ns for k in item[1]))
    issue = kernel_issue(max(ks, key=lambda k: k.duration_ns))
    module = next((o.module_path for o in operators if o.operator_id == op_id), None) or ks[0].module_path
    return f", led by {op_id} ({module or '-'}): {issue}" if issue else ""


def _host_bound(util: float, idle_ns: int, top_class_ns: int) -> bool:
    """Whether a window this busy, with this much idle time, is bound by the host rather than by its kernels: busy
    under the low-utilisation threshold, or under saturation with more idle time than its most common class."""
    idle_leads = util < rule("timeline", "saturated_pct") and idle_ns > top_class_ns
    return util < rule("timeline", "low_utilisation_pct") or idle_leads


def _borderline(health: TimelineHealth, host: bool, top_class_ns: int, other: Bottleneck) -> str | None:
    """The sentence saying that the verdict changes within the spread of the windows measured without the
    profiler (their shortest and longest, at the median window's busy time), or None when it holds across it."""
    if not (health.unprofiled and health.window_range_ns):
        return None
    shortest, longest = health.window_range_ns
    utils = [min(100.0, 100.0 * health.gpu_busy_ns / w) for w in (shortest, longest)]
    for window, util in zip((shortest, longest), utils, strict=True):
        if _host_bound(util, max(0, window - health.gpu_busy_ns), top_class_ns) != host:
            return (f"Borderline: the windows measured without the profiler ran {_us(shortest)} to {_us(longest)} "
                    f"(GPU busy {utils[0]:.0f} to {utils[1]:.0f} %), and at {_us(window)} the verdict would be "
                    f"{other.value}.")
    return None


def counter_remedy(tool: str) -> str:
    """How to get the hardware counters a profile made with `tool` lacks: an nsys profile whose ncu pass failed or
    did not run replays its captured kernels under ncu (`map`); a torch.profiler one needs the nsys backend."""
    if tool.startswith("nsys"):
        return ("its ncu pass did not run or failed (the profile's warnings say which); `operator-profiler map "
                "RUN_DIR` replays the captured run's kernels under ncu")
    return "profile with --backend nsys (nsys and ncu) for roofline and stalls"


def diagnose(health: TimelineHealth, kernels: list[KernelAnalysis], operators: list[OperatorAnalysis],
             counters: bool, tool: str = "torch_profiler") -> Diagnosis:
    """The window's bottleneck and its root cause in at most two sentences, and a third when the verdict changes
    within the spread of the windows measured without the profiler."""
    util = health.gpu_utilization_pct
    if not kernels:
        return Diagnosis(bottleneck=Bottleneck.HOST, root_cause="The window launched no GPU kernel: all its time "
                         "is host work.", triggers=["kernel_count=0"])
    time: Counter[Bottleneck] = Counter()
    for k in kernels:
        time[k.bottleneck] += k.duration_ns
    cls, ns = time.most_common(1)[0]
    tiny = (health.tiny_kernel_pct or 0) > rule("launch", "swarm_tiny_kernel_pct")
    waited = (health.launch_bound_kernel_pct or 0) >= 50
    host_cls = Bottleneck.LAUNCH_OVERHEAD if tiny or waited else Bottleneck.HOST
    host = _host_bound(util, health.idle_ns, ns)
    borderline = _borderline(health, host, ns, cls if host else host_cls)
    spread = ([f"window_range_ns={health.window_range_ns[0]}-{health.window_range_ns[1]}"]
              if borderline and health.window_range_ns else [])
    if host:
        idle_leads = util >= rule("timeline", "low_utilisation_pct")
        head = health.idle_by_cause_ns.get("head", 0)
        computes = health.host_compute_ns * 2 >= health.idle_ns
        what = (f"its own compute: {_us(health.host_compute_ns)} in operators that launch no kernel (on CPU "
                "tensors), under the profiler" if computes else "Python dispatch and kernel launches"
                + (", measured without the profiler" if health.unprofiled else
                   ", inflated here by profiler instrumentation (no timing pass ran)"))
        cause = (f"The GPU is busy {util:.1f} % of the {_us(health.window_ns)} window: its {health.kernel_count} "
                 f"kernels run {_us(health.mean_kernel_ns)} on average but wait {_us(health.mean_gap_ns)} on average "
                 f"for the host to launch them ({_us(head)} pass before the first one). The host — {what}"
                 + " — is the critical path, so faster kernels barely shorten the window"
                 + (", and neither do cheaper launches." if computes else ".")
                 + (f" Idle time ({_us(health.idle_ns)}) is a larger share of the window than the kernels of its "
                    f"most common class ({cls.value}, {_us(ns)})." if idle_leads else ""))
        return Diagnosis(bottleneck=host_cls, root_cause=cause + (f" {borderline}" if borderline else ""),
                         borderline=borderline, triggers=[
            f"gpu_utilization_pct={util:.1f}", f"mean_kernel_ns={health.mean_kernel_ns or 0:.0f}",
            f"mean_gap_ns={health.mean_gap_ns or 0:.0f}", f"tiny_kernel_pct={health.tiny_kernel_pct or 0:.0f}",
            f"launch_bound_kernel_pct={health.launch_bound_kernel_pct or 0:.0f}",
            *([f"host_compute_ns={health.host_compute_ns}"] if health.host_compute_ns else []), *spread])
    share = 100.0 * ns / max(sum(time.values()), 1)
    lead = _lead(cls, kernels, operators)
    second = "" if counters else (f" Kernels carry no hardware counters ({tool}), so classes beyond launch overhead "
                                  f"are unknown: {counter_remedy(tool)}.")
    cause = f"The GPU is busy {util:.1f} % of the window and {share:.0f} % of kernel time is {cls.value}-bound{lead}."
    return Diagnosis(bottleneck=cls, root_cause=cause + second + (f" {borderline}" if borderline else ""),
                     borderline=borderline,
                     triggers=[f"gpu_utilization_pct={util:.1f}", f"{cls.value}_kernel_time_pct={share:.0f}", *spread])


def cpu_only_analysis(profile: OperatorAttributedProfile, config: Configuration) -> Analysis:
    """A CPU-only profile: no GPU numbers, CPU hotspots by self time, nested operators included (an operator's
    self time is its span minus the operators it called, wherever in the call tree it ran)."""
    self_ns: dict[str, int] = defaultdict(int)
    total_ns: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    modules: dict[str, set[str]] = defaultdict(set)
    for op in profile.operators:
        agg = op.aggregated
        by_operator = agg.cpu_self_time_by_operator_ns or {op.operator_name: agg.cpu_self_time_ns or 0}
        for name, ns in by_operator.items():
            self_ns[name] += ns
            if op.module_path:
                modules[name].add(op.module_path)
        calls[op.operator_name] += 1
        total_ns[op.operator_name] += agg.cpu_total_time_ns or 0
    whole = sum(self_ns.values()) or 1
    hotspots = sorted((
        CpuHotspot(operator_name=name, module_paths=sorted(modules[name])[:5], calls=calls.get(name, 0),
                   cpu_self_time_ns=ns, cpu_total_time_ns=total_ns.get(name, 0),
                   share_of_self_time_pct=100.0 * ns / whole)
        for name, ns in self_ns.items()), key=lambda h: -h.cpu_self_time_ns)
    top = hotspots[0] if hotspots else None
    cause = NO_GPU + (f" The CPU hotspot is {top.operator_name} ({top.share_of_self_time_pct:.0f} % of CPU self time)."
                      if top else "")
    triggers = ["gpu_used=false"]
    outside = window_outside_operators(profile.window)
    if outside is not None:  # the operators are not where the window goes
        whole, inside = outside
        cause = (f"{NO_GPU} The window spends {100 - inside:.0f} % of its {whole / 1e6:.1f} ms outside torch "
                 "operators (Python code, other processes, waiting): start there, since no operator table shows it. "
                 f"The hotspots below rank the {(profile.window.cpu_operator_time_ns or 0) / 1e6:.1f} ms inside "
                 "operators" + (f" (the heaviest: {top.operator_name})." if top else "."))
        triggers.append(f"operator_time_pct={inside:.1f}")
    return Analysis(
        configuration=config, gpu_data=False, counters=False, diagnosis=Diagnosis(
            bottleneck=Bottleneck.UNKNOWN, root_cause=cause, triggers=triggers),
        cpu_hotspots=hotspots[:15], notes=[NO_GPU, "roofline, bottleneck classes, stalls and GPU timeline need a "
                                           "CUDA run: profile on a machine with an NVIDIA GPU"],
    )


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i in (0, len(row) - 2, len(row) - 1) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("-" * len(lines[0]))
    return lines


def _clip(text: str | None, width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def format_summary(analysis: Analysis) -> str:
    """Compact terminal summary: configuration, per-stage table, bottleneck, top-3 opportunities."""
    c = analysis.configuration
    lines = [f"configuration: {c.device} ({c.device_source}) | compile {c.compile_mode} | {c.run_mode} | "
             f"dtype {c.dtype or 'unknown'} | {c.tool} | {c.iters} iteration(s)"]
    if not analysis.gpu_data:
        lines += ["NO GPU DATA: " + analysis.diagnosis.root_cause, "",
                  "CPU hotspots by self time (every operator's own time, nested calls included; calls and CPU "
                  "total count the outermost calls, as `summary` ranks them; '-': it ran only inside other operators):"]
        rows = [["operator", "calls", "CPU self", "CPU total", "share"]]
        rows += [[_clip(h.operator_name, 40), str(h.calls or "-"), _us(h.cpu_self_time_ns),
                  _us(h.cpu_total_time_ns) if h.calls else "-",
                  f"{h.share_of_self_time_pct:.1f} %"] for h in analysis.cpu_hotspots[:8]]
        answered = {kind: p for p in PATTERNS.values() for kind in p.answers}  # the findings a pattern answers
        found = [f"finding: {f.title} — {f.detail} (see {answered[f.kind].knowledge})"
                 for f in analysis.findings if f.kind in answered]
        return "\n".join(lines + _table(rows) + (["", *found] if found else []) + _ranks_block(analysis))
    t = analysis.timeline
    if t is not None:
        lines.append(f"window: {_us(t.window_ns)} ({t.window_source}); GPU busy {_us(t.gpu_busy_ns)} = "
                     f"{t.gpu_utilization_pct:.1f} %; {t.kernel_count} kernels, mean {_us(t.mean_kernel_ns)}, "
                     f"{t.tiny_kernel_count} shorter than {_us(rule('launch', 'tiny_kernel_ns'))}")
        if t.devices:  # the busy time above is the union of several GPUs'
            lines.append("GPUs: " + ", ".join(f"{d.device_id} busy {_us(d.busy_ns)} = {d.utilization_pct:.1f} %"
                                              for d in t.devices)
                         + f"; busy at once {_us(t.device_overlap_ns)} (kernel times over the window: an estimate)")
    rows = [["stage (module / operator)", "time", "share", "TC %", "DRAM %", "occ %", "bottleneck", "key issue"]]
    for s in analysis.stages[:SUMMARY_STAGES]:
        rows.append([_clip(s.label, 34), _us(s.duration_ns), f"{s.share_of_kernel_time_pct:.1f} %",
                     _pct(s.tensor_pipe_pct), _pct(s.dram_throughput_pct), _pct(s.achieved_occupancy_pct),
                     s.bottleneck.value, _clip(s.key_issue, 60)])
    lines += ["", *_table(rows), "", f"bottleneck: {analysis.diagnosis.bottleneck.value} — "
              f"{analysis.diagnosis.root_cause}"]
    sol = analysis.speed_of_light
    if sol is not None:
        lines.append(f"speed of light: the window runs at {sol.pct_of_speed_of_light:.0f} % of its speed of light "
                     f"({_us(sol.floor_ns)} at its precisions, {_us(sol.reduced_precision_floor_ns)} with BF16 tensor "
                     f"cores, against {_us(sol.window_ns)}: its kernels as they are, at the device's peaks; fused "
                     f"kernels move fewer bytes and may go below it); a speedup above "
                     f"{sol.max_plausible_speedup:.1f}x is "
                     f"suspect (its GEMMs, convolutions and attention in BF16 at half the bytes, all else fused "
                     f"away: {_us(sol.plausible_floor_ns)}); {sol.estimate_label}")
    lines += _syncs_block(analysis)
    lines += ["", "top opportunities (estimates, upper bounds):"]
    if not analysis.opportunities:
        lines.append("  none above the reporting threshold")
    for o in analysis.opportunities[:3]:
        lines.append(f"  {o.rank}. {o.title}")
        lines.append(f"     estimated saving ≤ {_us(o.estimated_saving_ns)} end to end ({o.estimated_saving_pct:.1f} % "
                     f"of the window), kernel time ≤ {_us(o.kernel_time_saving_ns)}: {o.estimate_label}")
        lines.append(f"     triggers: {', '.join(o.triggers[:5])}")
        lines.append(f"     how: {o.knowledge}")
        for need in o.prerequisites:
            lines.append(f"     first: {need}")
    if analysis.device is None:
        lines.append("")
        lines += [n for n in analysis.notes if n.startswith("unknown GPU")]
    return "\n".join(lines + _ranks_block(analysis))


def _syncs_block(analysis: Analysis) -> list[str]:
    """Where the window makes the host wait for the GPU, with the idle time after each place's calls."""
    waiting = [p for p in analysis.syncs or [] if p.synchronizing]
    if not waiting:
        return []
    source = next((p.idle_source for p in waiting if p.idle_source), None)
    lines = ["", "host synchronisations (the GPU idles after each until the host launches again; idle time "
             + idle_wording(source) + "):"]
    for p in waiting[:5]:
        idle = f", {_us(p.idle_after_ns)} idle after" if p.idle_after_ns is not None else ""
        copy = f" ({p.copy_kind} {p.bytes} B)" if p.copy_kind and p.bytes is not None else ""
        saved = ", copying its saved tensors to the host (a saved-tensor hook)" if p.offloaded else ""
        lines.append(f"  {p.call_site or '(no call site)'}: {p.api} x{p.count} in {p.operator_name or '-'}{copy}"
                     f"{saved}{idle}")
    return lines


def _ranks_block(analysis: Analysis) -> list[str]:
    """The multi-rank view: verdict, per-rank table, the changes that answer its findings."""
    d = analysis.distributed
    if d is None:
        return []
    overlap = f"{d.overlap_pct:.1f} %" if d.overlap_pct is not None else "-"
    lines = ["", f"{d.world_size} ranks ({d.backend or 'unknown backend'}; {d.times_source}): "
             f"{d.verdict.replace('_', ' ')} — on rank {d.reference_rank} (the one that waited least in its "
             f"collectives) communication {d.communication_pct:.1f} % of the window, "
             f"{d.exposed_communication_pct:.1f} % not hidden by compute, overlap {overlap}"]
    rows = [["rank", "window", "compute", "comm", "exposed comm", "overlap", "idle"]]
    rows += [[str(r.rank), _us(r.window_ns), _us(r.compute_ns), _us(r.communication_ns),
              _us(r.exposed_communication_ns), _pct(r.overlap_pct), _us(r.idle_ns)] for r in d.ranks]
    lines += _table(rows)
    if d.communication_by_module_ns:
        lines.append(f"communication by module (rank {d.reference_rank}): " + ", ".join(
            f"{m} {_us(ns)}" for m, ns in list(d.communication_by_module_ns.items())[:5]))
    if d.stragglers:
        lines.append(f"stragglers: {', '.join(f'rank {r}' for r in d.stragglers)} (max arrival skew "
                     f"{_us(d.skew_ns_max or 0)})")
    lines += [f"note: {note}" for note in d.notes]
    changes = [o for o in analysis.opportunities if o.knowledge.startswith(DISTRIBUTED_KNOWLEDGE)]
    if changes:
        lines.append("multi-rank changes (estimates, upper bounds):")
        for o in changes[:5]:
            lines.append(f"  {o.rank}. {o.title}")
            lines.append(f"     estimated saving ≤ {_us(o.estimated_saving_ns)} ({o.estimated_saving_pct:.1f} % of the "
                         f"window): {o.estimate_label}")
            lines.append(f"     how: {o.knowledge}")
        for need in o.prerequisites:
            lines.append(f"     first: {need}")
    return lines
