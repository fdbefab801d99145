"""`Analysis`: the analysis.json that `operator-profiler analyze` writes beside its charts and trace.

A pure function of one profile.json (and the device table): roofline per kernel and per operator, bottleneck
classes, warp-stall breakdowns, timeline health, detected patterns and ranked opportunities. Every quantity
carries its unit in its field name (`_ns`, `_bytes`, `_pct`, `_flop`, `_per_s`); every saving is an estimate
and says so in `estimate_label`.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

ANALYSIS_SCHEMA_VERSION = "1.7"  # 1.1: `distributed`, the multi-rank view; 1.2: the verdict's spread
# 1.3: `syncs`, each place that makes the host wait for the GPU or copies memory, with its idle cost; the changes
# that must come before an opportunity (`prerequisites`)
# 1.4: the multi-rank view's reference rank (the one that waited least in its collectives) and its notes
# 1.5: forward work recomputed in the backward by activation checkpointing, on operators and as its own stages
# 1.6: the host's own compute in the idle time (`timeline.host_compute_ns`): no launch change recovers it
# 1.7: a sync point's `offloaded`: activations a saved-tensor hook copies to the host inside the forward's operators


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Bottleneck(str, Enum):
    """What limits a kernel, an operator or the window."""

    COMPUTE = "compute"
    MEMORY = "memory"
    LATENCY = "latency"
    LAUNCH_OVERHEAD = "launch_overhead"
    HOST = "host"
    UNKNOWN = "unknown"


class DeviceSpec(_Model):
    """The peaks every percentage is relative to, and where they come from."""

    key: str | None = Field(default=None, description="Entry of knowledge/devices.yaml, None when measured.")
    name: str = Field(description="Marketing name, e.g. 'NVIDIA H200 SXM 141GB'.")
    reported_name: str | None = Field(default=None, description="The name torch reported for the profiled GPU.")
    measured: bool = Field(default=False, description="True when the peaks were measured by microbenchmark.")
    source: str = Field(description="Datasheet/whitepaper the numbers come from, or 'measured by microbenchmark'.")
    architecture: str | None = None
    sm_count: int | None = None
    base_clock_mhz: float | None = None
    boost_clock_mhz: float | None = None
    peak_flop_per_s: dict[str, float] = Field(
        default_factory=dict, description="Dense peak FLOP/s per precision key (fp32, tf32_tensor, bf16_tensor...)."
    )
    peak_clock_mhz: dict[str, float] = Field(
        default_factory=dict, description="SM clock each peak is quoted at (to rescale to the clock a kernel ran at)."
    )
    dram_bandwidth_bytes_per_s: float | None = None
    l2_bytes: int | None = None
    memory_bytes: int | None = None
    notes: list[str] = Field(default_factory=list)


class Roofline(_Model):
    """Roofline numbers of one kernel or one operator, from ncu counts over ncu's own duration."""

    flop: float = Field(default=0.0, description="FLOPs from counters (tensor ops + CUDA-core, FMA = 2).")
    flop_by_precision: dict[str, float] = Field(default_factory=dict)
    dram_bytes: float | None = Field(default=None, description="DRAM bytes read + written.")
    arithmetic_intensity_flop_per_byte: float | None = None
    ncu_duration_ns: float | None = Field(
        default=None, description="gpu__time_duration under ncu replay (base clocks), the time base of the rates."
    )
    achieved_flop_per_s: float | None = None
    achieved_dram_bytes_per_s: float | None = None
    sm_clock_mhz: float | None = Field(default=None, description="SM clock during the ncu replay (cycles/duration).")
    precision: str | None = Field(default=None, description="Precision whose roof applies (the most utilised one).")
    compute_pct_of_peak: float | None = Field(default=None, description="Achieved FLOP/s over the precision's peak.")
    dram_pct_of_peak: float | None = Field(default=None, description="Achieved DRAM bytes/s over peak bandwidth.")
    ridge_flop_per_byte: float | None = Field(default=None, description="Peak FLOP/s / DRAM bandwidth, same precision.")
    roof: str | None = Field(default=None, description="'compute' or 'memory': which side of the ridge the point is.")
    pct_of_roof: float | None = Field(default=None, description="Achieved over attainable at this intensity, <= 100.")
    artifact: str | None = Field(
        default=None, description="Set when a rate exceeded its peak (a measurement artifact)."
    )


class StallBreakdown(_Model):
    """Warp-stall reasons of one kernel: warps stalled per issued instruction, by reason."""

    per_issue: dict[str, float] = Field(description="Reason -> average warps stalled on it per issue-active cycle.")
    share_pct: dict[str, float] = Field(description="Reason -> share of the collected stall reasons, %.")
    dominant: str | None = None
    dominant_share_pct: float | None = None
    issue_active_pct: float | None = None
    flagged: bool = Field(default=False, description="Nsight Compute's rule would flag the dominant stall.")
    cause: str | None = None
    fix: str | None = None


class KernelAnalysis(_Model):
    """One window kernel: its timing, roofline, class and stalls."""

    kernel_id: int
    kernel_name: str
    operator_id: str | None = None
    operator_name: str | None = None
    module_path: str | None = None
    stream_id: int | None = None
    start_ns: int
    duration_ns: int = Field(description="Duration at real clocks (nsys/Kineto).")
    gap_before_ns: int | None = Field(default=None, description="GPU idle time just before this kernel, ns.")
    gap_after_ns: int | None = Field(default=None, description="GPU idle time just after this kernel, ns.")
    has_counters: bool = False
    propagated_from: int | None = None
    roofline: Roofline | None = None
    tensor_pipe_pct: float | None = None
    dram_throughput_pct: float | None = None
    sm_throughput_pct: float | None = None
    memory_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    waves_per_sm: float | None = None
    grid_blocks: int | None = None
    bottleneck: Bottleneck = Bottleneck.UNKNOWN
    reasons: list[str] = Field(default_factory=list, description="`metric=value` triggers behind the class.")
    stalls: StallBreakdown | None = None


class OperatorAnalysis(_Model):
    """One operator call rolled up from its kernels."""

    operator_id: str
    operator_name: str
    module_path: str | None = None
    phase: str | None = Field(default=None, description="forward, backward or optimizer (profile schema 1.2).")
    call_site: str | None = Field(default=None, description="`path:line` of the user's code that made the call.")
    recomputed: bool = Field(default=False, description="Forward work activation checkpointing runs again in the "
                             "backward (profile schema 1.8) (1.5).")
    is_fused: bool = False
    kernel_count: int = 0
    duration_ns: int = 0
    share_of_kernel_time_pct: float = 0.0
    roofline: Roofline | None = None
    tensor_pipe_pct: float | None = None
    dram_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    bottleneck: Bottleneck = Bottleneck.UNKNOWN
    key_issue: str | None = None
    cpu_self_time_ns: int | None = None
    cpu_total_time_ns: int | None = None


class StageRow(_Model):
    """A row of the summary's per-stage table: one module (or operator when no module is known)."""

    label: str = Field(description="The module path (operator name when none), with its phase in a training step "
                       "(and `recomputed` for forward work checkpointing runs again in the backward).")
    module_path: str | None = None
    phase: str | None = None
    operators: list[str] = Field(default_factory=list)
    kernel_count: int = 0
    duration_ns: int = 0
    share_of_kernel_time_pct: float = 0.0
    tensor_pipe_pct: float | None = None
    dram_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    bottleneck: Bottleneck = Bottleneck.UNKNOWN
    key_issue: str | None = None


class Gap(_Model):
    """One idle stretch of the GPU inside the window."""

    start_ns: int
    duration_ns: int
    after_kernel_id: int | None = None
    before_kernel_id: int | None = None
    cause: str = Field(description="head, tail, launch_bound, host_sync, host_overhead.")


class StreamUsage(_Model):
    stream_id: int | None
    kernel_count: int
    busy_ns: int
    device_id: int | None = Field(default=None, description="The GPU the stream belongs to.")


class DeviceUsage(_Model):
    """One GPU of a window whose kernels ran on several (a model split across the GPUs of one process)."""

    device_id: int | None
    kernel_count: int
    busy_ns: int = Field(description="Union of its kernels on the profiled timeline, ns (nsys' kernel times).")
    utilization_pct: float = Field(description="busy_ns over the window (the unprofiled one when measured), 0-100: "
                                   "an estimate when the window was timed without the profiler.")


class OperatorKernelCount(_Model):
    operator_name: str
    calls: int
    kernels: int
    kernel_time_ns: int


class TimelineHealth(_Model):
    """How well the window keeps the GPU busy."""

    window_ns: int = Field(description="Window length on the GPU clock (CUDA events), else host wall time.")
    window_source: str
    unprofiled: bool = Field(
        default=False, description="True: the window, its busy time and its gaps are the ones measured without the "
        "profiler (the timing pass); False: the instrumented window's, whose gaps the profiler inflates.",
    )
    profiled_window_ns: int | None = Field(default=None, description="The instrumented window's length, ns.")
    window_range_ns: list[int] | None = Field(
        default=None, description="Shortest and longest of the windows measured without the profiler, ns (1.2).",
    )
    profiled_gpu_utilization_pct: float | None = Field(
        default=None, description="GPU utilisation of the instrumented window, for comparison, 0-100."
    )
    wall_time_ns: int
    gpu_busy_ns: int
    gpu_utilization_pct: float = Field(description="Busy (union of kernels) over window, 0-100.")
    idle_ns: int
    kernel_count: int
    kernel_time_ns: int
    mean_kernel_ns: float | None = None
    median_kernel_ns: float | None = None
    tiny_kernel_count: int = 0
    tiny_kernel_pct: float | None = Field(default=None, description="% of kernels shorter than the tiny threshold.")
    launch_bound_kernel_pct: float | None = Field(
        default=None, description="% of kernels whose preceding idle gap is longer than the kernel itself."
    )
    mean_gap_ns: float | None = None
    host_compute_ns: int = Field(
        default=0, description="Of the idle time, the host's own compute: operators that launched no kernel and made "
        "no CUDA call (the profile's host_compute_ns, under the profiler, at most idle_ns), ns. No change to "
        "launches recovers it: estimates that shrink idle gaps leave it (1.6).",
    )
    idle_by_cause_ns: dict[str, int] = Field(default_factory=dict)
    largest_gaps: list[Gap] = Field(default_factory=list)
    streams: list[StreamUsage] = Field(default_factory=list)
    multi_stream_overlap_ns: int = 0
    devices: list[DeviceUsage] = Field(default_factory=list, description="Each GPU's share, when kernels ran on "
                                       "more than one.")
    device_overlap_ns: int = Field(default=0, description="Time the GPUs were busy at once: the sum of their busy "
                                   "times less their union, ns.")
    kernels_per_operator: list[OperatorKernelCount] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class SpeedOfLight(_Model):
    """The window's speed of light: the least time its kernels could take on this GPU (an estimate)."""

    window_ns: int = Field(description="The window the floor is compared with (the unprofiled one when measured).")
    window_source: str
    floor_ns: int = Field(description="Kernels at the device's peaks in the precisions they ran in, plus launches.")
    reduced_precision_floor_ns: int = Field(description="The same with every FP32/TF32 FLOP on BF16 tensor cores.")
    launch_floor_ns: int
    kernels_bounded: int = Field(description="Kernels with FLOP and DRAM counts (ncu counters).")
    kernels_at_measured_time: int = Field(description="Kernels without counters, counted at their measured time.")
    pct_of_speed_of_light: float = Field(description="floor_ns over the window, 0-100: how close the window runs.")
    plausible_floor_ns: int = Field(
        description="The least time any change could plausibly reach: the GEMM, convolution and attention kernels, "
        "and those of ops no compiler fuses (cuDNN RNNs, sorts...), with counters, on BF16 tensor cores reading half "
        "the bytes of their FP32 data, one launch each; every other kernel fused away."
    )
    max_plausible_speedup: float = Field(
        description="The window over plausible_floor_ns: a larger measured speedup is suspect."
    )
    estimate_label: str


class Finding(_Model):
    """A detected pattern (FP32 matmul on CUDA cores, unfused attention, tiny-kernel swarm...)."""

    kind: str
    title: str
    operators: list[str] = Field(default_factory=list, description="operator_ids involved.")
    module_paths: list[str] = Field(default_factory=list)
    kernel_ids: list[int] = Field(default_factory=list)
    triggers: list[str] = Field(default_factory=list, description="`metric=value` evidence.")
    detail: str


class Opportunity(_Model):
    """A ranked change with its evidence, an Amdahl-bounded estimate, and where to read how."""

    rank: int
    title: str
    change_class: str = Field(description="Pattern name, e.g. cuda_graphs, dtype_autocast, sdpa_substitution.")
    operators: list[str] = Field(default_factory=list)
    module_paths: list[str] = Field(default_factory=list)
    triggers: list[str] = Field(default_factory=list)
    kernel_time_saving_ns: int = Field(default=0, description="Estimate: GPU kernel time removed (upper bound).")
    estimated_saving_ns: int = Field(description="Estimate: end-to-end window time saved (upper bound).")
    estimated_saving_pct: float = Field(description="Estimate: end-to-end saving as % of the window.")
    estimate_label: str = Field(description="Says it is an estimate and what bounds it.")
    knowledge: str = Field(description="Pointer into knowledge/, e.g. knowledge/fx_patterns/cuda_graphs.py.")
    findings: list[str] = Field(default_factory=list, description="Finding kinds this opportunity answers.")
    prerequisites: list[str] = Field(default_factory=list, description="Changes that must come first for this one "
                                     "to apply: a CUDA graph or a whole-graph compile cannot hold a host "
                                     "synchronisation or a data-dependent shape (1.3).")


class SyncPoint(_Model):
    """One place in the window that makes the host wait for the GPU, or copies or sets memory: the calls made there
    (one `call_site`, API and operator), with what they cost (1.3)."""

    call_site: str | None = Field(description="`path:line` of the user's code that made the calls, when known.")
    api: str = Field(description="e.g. cudaStreamSynchronize, cudaMemcpyAsync.")
    kind: str = Field(description="sync, memcpy or memset.")
    operator_name: str | None = None
    module_path: str | None = None
    synchronizing: bool = Field(description="The host waits in these calls for the GPU.")
    data_dependent: bool = Field(description="Their operator reads a value back (`.item()`) or has data-dependent "
                                 "output shapes (`nonzero`, `unique`, `masked_select`...).")
    offloaded: bool = Field(default=False, description="Copies to the host made inside forward operators that copy "
                            "nothing themselves: tensors autograd saves for the backward, offloaded by a saved-tensor "
                            "hook (`torch.autograd.graph.save_on_cpu`) as the operator saves them (1.7).")
    count: int = Field(description="Calls made there in the window.")
    bytes: int | None = Field(default=None, description="Bytes the copies or sets moved in all.")
    copy_kind: str | None = None
    src_memory: str | None = None
    dst_memory: str | None = None
    host_wait_ns: int = Field(description="Host time inside the calls under the profiler, ns.")
    idle_after_ns: int | None = Field(default=None, description="GPU idle time before the kernel after each "
                                      "synchronising call, summed, ns (a gap several calls share is counted once, "
                                      "for the first): in the window measured without the profiler when "
                                      "`idle_source` says so.")
    idle_source: str | None = Field(default=None, description="'unprofiled' (the timing pass's gaps), 'scaled' (the "
                                    "profiled gaps scaled to the idle time of the window timed without the "
                                    "profiler, which traced none of it) or 'profiled' (instrumentation inflates it).")
    event_ids: list[int] = Field(default_factory=list, description="The profile's runtime_events.")


class Diagnosis(_Model):
    """The window's bottleneck in at most two sentences, with its evidence."""

    bottleneck: Bottleneck
    root_cause: str
    triggers: list[str] = Field(default_factory=list)
    borderline: str | None = Field(
        default=None, description="Set when the verdict changes within the spread of the windows measured without the "
        "profiler: their range and the verdict at the end that changes it (also the root cause's last sentence; 1.2).",
    )


class CpuHotspot(_Model):
    operator_name: str
    module_paths: list[str] = Field(default_factory=list)
    calls: int
    cpu_self_time_ns: int
    cpu_total_time_ns: int
    share_of_self_time_pct: float


class Configuration(_Model):
    device: str
    device_source: str
    compile_mode: str
    run_mode: str
    dtype: str | None = None
    tool: str
    iters: int


class RankRow(_Model):
    """One rank's window as ranks.json measured it (the rank's profiled timeline), ns."""

    rank: int
    window_ns: int
    compute_ns: int
    communication_ns: int
    exposed_communication_ns: int = Field(description="Communication not overlapped with compute.")
    overlap_pct: float | None = Field(default=None, description="Share of the communication overlapped, 0-100.")
    idle_ns: int


class DistributedAnalysis(_Model):
    """The multi-rank view of a run: where the ranks' windows went and what they wait for (from ranks.json)."""

    world_size: int
    backend: str | None = None
    ranks_path: str
    verdict: str = Field(description="'communication_bound', 'poor_overlap', 'straggler' or 'compute_bound'.")
    reference_rank: int | None = Field(
        default=None, description="The rank that waited least for the others inside its collectives: its time in "
        "them is moving data, not waiting; the communication figures are its own (1.4).")
    communication_pct: float = Field(description="Reference rank: communication as % of its window.")
    exposed_communication_pct: float = Field(description="Reference rank: communication not hidden by compute, % "
                                                          "of its window.")
    overlap_pct: float | None = Field(default=None, description="Reference rank: share of communication overlapped.")
    skew_ns_max: int | None = None
    stragglers: list[int] = Field(default_factory=list)
    communication_by_module_ns: dict[str, int] = Field(
        default_factory=dict, description="The reference rank's collective time by module, largest first.")
    times_source: str = Field(description="What the times were measured under.")
    ranks: list[RankRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="What the merge saw but does not find: a rank late "
                             "under the profiler only (1.4).")


class Analysis(_Model):
    """analysis.json: the diagnosis of one profile."""

    schema_version: str = ANALYSIS_SCHEMA_VERSION
    profile_path: str | None = None
    configuration: Configuration
    gpu_data: bool = Field(description="False for CPU-only profiles: no GPU numbers exist.")
    counters: bool = Field(description="True when kernels carry ncu counters (roofline, classes, stalls).")
    device: DeviceSpec | None = None
    diagnosis: Diagnosis
    timeline: TimelineHealth | None = None
    stages: list[StageRow] = Field(default_factory=list)
    operators: list[OperatorAnalysis] = Field(default_factory=list)
    kernels: list[KernelAnalysis] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    opportunities: list[Opportunity] = Field(default_factory=list)
    syncs: list[SyncPoint] | None = Field(
        default=None, description="Where the window synchronises the host or copies memory, costliest first; None "
        "where the profile holds no runtime events (before profile schema 1.5) (1.3).")
    cpu_hotspots: list[CpuHotspot] = Field(default_factory=list)
    speed_of_light: SpeedOfLight | None = None
    distributed: DistributedAnalysis | None = Field(
        default=None, description="Multi-rank runs: the ranks' communication, overlap and stragglers.")
    artifacts: dict[str, str] = Field(default_factory=dict, description="Files written: name -> path.")
    notes: list[str] = Field(default_factory=list, description="Caveats every reader needs (clocks, caches...).")
