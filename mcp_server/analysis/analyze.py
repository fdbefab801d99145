"""analyze: profile.json -> analysis.json + roofline.png + time_by_operator.png + trace.json.

`analyze_profile(profile, out_dir)` is a pure function of the profile and the knowledge tables, except for
one case: a GPU missing from knowledge/devices.yaml, whose peaks are measured by microbenchmark under the
workload's interpreter (when it exists here and sees that GPU) and cached in OUT_DIR/device_peaks.json.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mcp_server.analysis.charts import roofline_chart, time_by_operator_chart
from mcp_server.analysis.classify import classify_kernel, kernel_issue, key_issue
from mcp_server.analysis.cudnn_choice import heuristic_convolutions
from mcp_server.analysis.data_parallel import NEED as DATA_PARALLEL_NEED
from mcp_server.analysis.data_parallel import data_parallel_finding
from mcp_server.analysis.detect import (
    fp32_tensor_core_candidates,
    fusible_kernels,
    half_precision_gemms,
    structural_findings,
    unfused_attention,
    window_findings,
    work_kernels,
)
from mcp_server.analysis.devices import PEAKS_FILE, load_measured, match_device, measure_peaks, save_measured
from mcp_server.analysis.diagnosis import counter_remedy, cpu_only_analysis, diagnose, stage_rows
from mcp_server.analysis.floor import speed_of_light
from mcp_server.analysis.host_compute import host_compute_finding
from mcp_server.analysis.kv_cache import KV_NEED, growing_kv_cache
from mcp_server.analysis.opportunities import build_opportunities
from mcp_server.analysis.pooled_gemms import pooled_gemm_output
from mcp_server.analysis.rank_findings import distributed_analysis, merged
from mcp_server.analysis.roofline import combined_roofline, kernel_roofline
from mcp_server.analysis.split_chains import split_fusion
from mcp_server.analysis.stalls import stall_breakdown
from mcp_server.analysis.syncs import prerequisites, sync_finding, sync_points
from mcp_server.analysis.timeline_health import Placed, place_kernels, timeline_health, unprofiled_window, window_length
from mcp_server.analysis.trace import write_trace
from mcp_server.errors import ProfilerError
from mcp_server.schema.analysis import (
    Analysis,
    Bottleneck,
    Configuration,
    DeviceSpec,
    Finding,
    KernelAnalysis,
    OperatorAnalysis,
)
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.profile import OperatorAttributedProfile
from mcp_server.schema.ranks import RanksSummary

ANALYSIS_JSON = "analysis.json"
ROOFLINE_PNG = "roofline.png"
TIME_PNG = "time_by_operator.png"
TRACE_JSON = "trace.json"
COUNTER_NOTES = [
    "achieved FLOP/s and bytes/s come from ncu counts over ncu's own gpu__time_duration: ncu replays each kernel "
    "at locked base clocks (--clock-control base), so compute peaks are rescaled to the SM clock of that replay; "
    "durations, shares and gaps come from nsys/Kineto at real clocks",
    "ncu flushes caches before each replayed kernel (--cache-control all): DRAM bytes are cold-cache figures; "
    "in the real run small working sets stay in L2",
]
# Short phrase per finding kind, most telling first (an operator shows the first that applies).
_FINDING_ISSUE = {"unfused_attention": "unfused attention", "sdpa_math_path": "SDPA math path",
                  "separate_qkv": "separate q/k/v GEMM", "conv_bn_unfolded": "unfolded batch norm",
                  "layout_conversion": "layout copy", "host_sync": "host sync", "register_spills": "register spills",
                  "fp32_matmul": "FP32 GEMM on CUDA cores", "fp32_conv": "FP32 conv on CUDA cores",
                  "bn_not_frozen": "BN not folded (no freezing)", "half_matmul": "BF16/FP16 GEMM (FP8 candidate)",
                  "growing_kv_cache": "growing KV cache", "split_fusion": "chain split by a fallback op",
                  "pooled_gemm_output": "GEMM output only max-pooled", "heuristic_conv": "cuDNN heuristic pick",
                  "recomputed_forward": "recomputed (checkpointing)"}
_TORCH_DTYPE = {"float": "float32", "double": "float64", "c10::half": "float16", "half": "float16",
                "c10::bfloat16": "bfloat16", "bfloat16": "bfloat16", "long int": "int64", "int": "int32"}
_DTYPE_OF_PRECISION = {"fp32": "float32", "tensor_tf32": "float32 on TF32 tensor cores", "tensor_bf16": "bfloat16",
                       "tensor_fp16": "float16", "fp16": "float16", "fp64": "float64", "tensor_fp64": "float64",
                       "tensor_fp8": "float8"}


def resolve_device(profile: OperatorAttributedProfile, out_dir: Path, device: DeviceSpec | None = None,
                   measure: bool = True) -> tuple[DeviceSpec | None, list[str]]:
    """Peaks for the profiled GPU: the caller's, devices.yaml's, cached measured ones, or a fresh measurement."""
    meta = profile.capture_metadata
    if device is not None:
        return device, [f"device peaks supplied by the caller ({device.source})"]
    matched = match_device(meta.device_name)
    if matched is not None:
        return matched, []
    name = meta.device_name or "(unnamed GPU)"
    cached = Path(out_dir) / PEAKS_FILE
    if cached.is_file():
        spec = load_measured(cached)
        if spec.reported_name == meta.device_name:
            return spec, [f"{name} is not in knowledge/devices.yaml: peaks measured by microbenchmark ({cached})"]
    notes = []
    if measure and Path(meta.python_executable).is_file():
        try:
            spec = measure_peaks(meta.python_executable)
        except ProfilerError as exc:
            notes.append(f"the peak microbenchmark could not run: {exc.one_line()}")
        else:
            if spec.reported_name == meta.device_name:
                save_measured(spec, cached)
                return spec, [f"{name} is not in knowledge/devices.yaml: peaks measured by microbenchmark"]
            notes.append(f"the microbenchmark saw {spec.reported_name!r}, not the profiled {name!r}: not used")
    elif measure:
        notes.append(f"the workload's interpreter {meta.python_executable} is not on this machine")
    notes.append(f"unknown GPU {name}: not in knowledge/devices.yaml and no measured peaks, so roofline percentages "
                 "are omitted — add it to knowledge/devices.yaml or run analyze on the machine with that GPU")
    return None, notes


def _kernel_analysis(p: Placed, device: DeviceSpec | None, sm_count: int | None) -> KernelAnalysis:
    kernel = p.kernel
    stalls = stall_breakdown(kernel) if kernel.metrics else None
    cls, reasons = classify_kernel(kernel, p.gap_before_ns, stalls)

    def metric(key: str) -> float | None:
        m = kernel.metrics.get(key)
        return m.value if m is not None else None

    grid = metric("grid_size")
    return KernelAnalysis(
        kernel_id=kernel.kernel_id, kernel_name=kernel.kernel_name,
        operator_id=p.op.operator_id if p.op else None, operator_name=p.op.operator_name if p.op else None,
        module_path=kernel.module_path or (p.op.module_path if p.op else None), stream_id=kernel.stream_id,
        start_ns=kernel.start_ns, duration_ns=kernel.duration_ns, gap_before_ns=p.gap_before_ns,
        gap_after_ns=p.gap_after_ns, has_counters=bool(kernel.metrics), propagated_from=kernel.propagated_from,
        roofline=kernel_roofline(kernel, device), tensor_pipe_pct=metric("tensor_pipe_active_pct"),
        dram_throughput_pct=metric("dram_throughput_pct"), sm_throughput_pct=metric("sm_throughput_pct"),
        memory_throughput_pct=metric("memory_throughput_pct"),
        achieved_occupancy_pct=metric("achieved_occupancy_pct"),
        theoretical_occupancy_pct=metric("theoretical_occupancy_pct"), waves_per_sm=metric("waves_per_sm"),
        grid_blocks=int(grid) if grid is not None else None, bottleneck=cls,
        reasons=[*reasons, f"key_issue={key_issue(kernel, cls, p.gap_before_ns, stalls, sm_count)}"],
        stalls=stalls,
    )


def _weighted(kernels: list[KernelAnalysis], field: str) -> float | None:
    pairs = [(getattr(k, field), max(k.duration_ns, 1)) for k in kernels if getattr(k, field) is not None]
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None


def dominant_class(kernels: list[KernelAnalysis]) -> Bottleneck:
    """The class holding the most kernel time."""
    time: Counter[Bottleneck] = Counter()
    for k in kernels:
        time[k.bottleneck] += k.duration_ns
    return time.most_common(1)[0][0] if time else Bottleneck.UNKNOWN


def _operator_analyses(profile: OperatorAttributedProfile, kernels: dict[int, KernelAnalysis],
                       device: DeviceSpec | None, findings: list[Finding]) -> list[OperatorAnalysis]:
    total = sum(k.duration_ns for k in kernels.values()) or 1
    flagged: dict[str, str] = {}
    order = list(_FINDING_ISSUE)
    for finding in sorted(findings, key=lambda f: order.index(f.kind) if f.kind in order else len(order)):
        for op_id in finding.operators:
            flagged.setdefault(op_id, _FINDING_ISSUE.get(finding.kind, finding.kind))
    rows = []
    for op in profile.operators:
        mine = [kernels[k.kernel_id] for k in op.kernels if k.kernel_id in kernels]
        longest = max(mine, key=lambda k: k.duration_ns, default=None)
        flag, own = flagged.get(op.operator_id), kernel_issue(longest) if longest else None
        issue = "; ".join(x for x in (None if own and flag and own.startswith(flag) else flag, own) if x)
        duration = sum(k.duration_ns for k in mine)
        rows.append(OperatorAnalysis(
            operator_id=op.operator_id, operator_name=op.operator_name, module_path=op.module_path,
            phase=op.phase, call_site=op.call_site, recomputed=op.recomputed, is_fused=op.is_fused,
            kernel_count=len(mine), duration_ns=duration,
            share_of_kernel_time_pct=100.0 * duration / total, roofline=combined_roofline(op.kernels, device),
            tensor_pipe_pct=_weighted(mine, "tensor_pipe_pct"),
            dram_throughput_pct=_weighted(mine, "dram_throughput_pct"),
            achieved_occupancy_pct=_weighted(mine, "achieved_occupancy_pct"), bottleneck=dominant_class(mine),
            key_issue=issue or None,
        ))
    return rows


def _dtype(profile: OperatorAttributedProfile, kernels: list[KernelAnalysis]) -> str | None:
    dtypes = Counter(op.input_dtypes[0] for op in profile.operators if op.input_dtypes and op.input_dtypes[0])
    if dtypes:
        name = dtypes.most_common(1)[0][0]
        return _TORCH_DTYPE.get(name.lower(), name)
    flops: Counter[str] = Counter()
    for k in kernels:
        if k.roofline:
            flops.update(k.roofline.flop_by_precision)
    if not flops:
        return None
    top = flops.most_common(1)[0][0]
    return f"{_DTYPE_OF_PRECISION.get(top, top)} (from counters)"


def _configuration(profile: OperatorAttributedProfile, device: DeviceSpec | None, dtype: str | None) -> Configuration:
    meta = profile.capture_metadata
    if not meta.gpu_used:
        source = "no GPU used"
    elif device is None:
        source = "unknown GPU: no peaks"
    elif device.measured:
        source = "peaks measured by microbenchmark"
    else:
        source = f"peaks: {device.name}, datasheet (knowledge/devices.yaml: {device.key})"
    graphs = {op.compiled_graph for op in profile.operators if op.compiled_graph}
    mode = meta.compile_mode if meta.compile_mode != "eager" or not graphs \
        else f"eager (the workload's own torch.compile: {len(graphs)} compiled graph(s) ran)"
    return Configuration(device=meta.device_name or meta.device_type, device_source=source, compile_mode=mode,
                         run_mode=meta.run_mode, dtype=dtype, tool=meta.tool, iters=meta.iters)


def _write_outputs(analysis: Analysis, placed: list[Placed], out_dir: Path) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        analysis.notes.append("charts not written: matplotlib is not installed (pip install 'matplotlib>=3.7')")
    else:
        for name, draw in ((ROOFLINE_PNG, roofline_chart), (TIME_PNG, time_by_operator_chart)):
            if draw(analysis, out_dir / name) is not None:
                analysis.artifacts[name] = str(out_dir / name)
    if placed:
        analysis.artifacts[TRACE_JSON] = str(write_trace(analysis, placed, out_dir / TRACE_JSON))
    else:
        analysis.notes.append("trace.json not written: the profile holds no GPU kernels to place on a timeline")
    if ROOFLINE_PNG not in analysis.artifacts and analysis.gpu_data:
        analysis.notes.append("roofline.png not written: no kernel has counters with both FLOPs and DRAM bytes, "
                              "or no device peaks are known")
    analysis.artifacts[ANALYSIS_JSON] = str(out_dir / ANALYSIS_JSON)
    write_model_atomic(out_dir / ANALYSIS_JSON, analysis)


def _with_ranks(analysis: Analysis, profile: OperatorAttributedProfile,
                ranks: tuple[RanksSummary, Path] | None) -> None:
    if ranks is None:
        return
    analysis.distributed, findings, opportunities = distributed_analysis(ranks[0], profile, ranks[1])
    analysis.findings += findings
    analysis.opportunities = merged(analysis.opportunities, opportunities)
    info = profile.capture_metadata.distributed
    analysis.notes.append(f"rank {info.rank if info else 0}'s diagnosis, with the run's multi-rank view (ranks.json); "
                          "every rank's own profile.json is in rank<R>/")


def analyze_profile(profile: OperatorAttributedProfile, out_dir: Path, *, profile_path: Path | None = None,
                    device: DeviceSpec | None = None, measure: bool = True,
                    ranks: tuple[RanksSummary, Path] | None = None) -> Analysis:
    """Diagnose one profile and write analysis.json, roofline.png, time_by_operator.png and trace.json; with
    `ranks` (ranks.json's content and path), add the multi-rank view, findings and changes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = profile.capture_metadata
    if not meta.gpu_used:
        analysis = cpu_only_analysis(profile, _configuration(profile, None, _dtype(profile, [])))
        analysis.profile_path = str(profile_path) if profile_path else None
        growing = growing_kv_cache(profile)  # structure, from shapes: what a GPU run of the loop would meet first
        analysis.findings += [growing] if growing else []
        _with_ranks(analysis, profile, ranks)
        _write_outputs(analysis, [], out_dir)
        return analysis
    spec, notes = resolve_device(profile, out_dir, device, measure)
    window_ns, source = window_length(profile)
    placed = place_kernels(profile, window_ns)
    health = timeline_health(profile, placed, window_ns, source)
    ground = unprofiled_window(profile)
    if ground is not None:  # every window-level verdict and estimate from the window without the profiler
        window_ns, source, placed = ground
        health = timeline_health(profile, placed, window_ns, source, profiled=health)
    sm_count = (spec.sm_count if spec else None) or meta.sm_count
    kernels = [_kernel_analysis(p, spec, sm_count) for p in placed]
    by_id = {k.kernel_id: k for k in kernels}
    findings = [*fp32_tensor_core_candidates(profile, placed), *half_precision_gemms(profile, placed),
                *unfused_attention(profile),
                *window_findings(profile, health), *structural_findings(profile, placed)]
    growing, split = growing_kv_cache(profile), split_fusion(profile, placed)
    replicated = data_parallel_finding(profile, health)
    findings += [f for f in (growing, split, pooled_gemm_output(profile, placed),
                             heuristic_convolutions(profile, placed), host_compute_finding(profile, health), replicated)
                 if f is not None]
    points = sync_points(profile)
    found = sync_finding(points) if points is not None else None
    if points is not None:  # the calls themselves, with their sites, in place of the operators' names
        findings = [f for f in findings if f.kind != "host_sync"] + ([found] if found else [])
    operators = _operator_analyses(profile, by_id, spec, findings)
    fusible = fusible_kernels(placed) if meta.compile_mode == "eager" else set()
    # the model compiled, or one decode step captured, needs only the model's own synchronisations gone
    opportunities = build_opportunities(profile, placed, by_id, findings, health, spec, fusible,
                                        prerequisites(profile, points) + ([KV_NEED] if growing else [])
                                        + ([DATA_PARALLEL_NEED] if replicated else []), points,
                                        prerequisites(profile, points, in_modules=True))
    counters = any(k.has_counters for k in kernels)
    if counters:
        notes += COUNTER_NOTES
    else:
        notes.append(f"kernels carry no hardware counters ({meta.tool}): roofline, compute/memory/latency classes "
                     f"and warp stalls need them ({counter_remedy(meta.tool)}); classes here are launch overhead "
                     "(from timing) or unknown")
    artifacts = [k for k in kernels if k.roofline and k.roofline.artifact]
    if artifacts:
        notes.append(f"{len(artifacts)} kernels exceeded a peak (measurement artifact, flagged and clamped): "
                     + ", ".join(str(k.kernel_id) for k in artifacts[:10]))
    analysis = Analysis(
        profile_path=str(profile_path) if profile_path else None,
        configuration=_configuration(profile, spec, _dtype(profile, kernels)), gpu_data=True, counters=counters,
        device=spec, diagnosis=diagnose(health, kernels, operators, counters, meta.tool), timeline=health,
        stages=stage_rows(operators, kernels), operators=operators, kernels=kernels, findings=findings,
        opportunities=opportunities, syncs=points, notes=notes + profile.warnings[:5],
        speed_of_light=speed_of_light(kernels, spec, window_ns, source, work_kernels(placed),
                                      {p.kernel.kernel_id: p.kernel.device_id for p in placed}),
    )
    _with_ranks(analysis, profile, ranks)
    _write_outputs(analysis, placed, out_dir)
    return analysis
