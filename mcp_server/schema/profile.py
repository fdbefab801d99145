"""`OperatorAttributedProfile`: the profile.json every later stage reads.

Field names follow the seed's profile.json (`schema_version`, `capture_metadata`, `operators[]` with
`operator_id`, `operator_name`, `call_index`, `is_fused`, `kernels[]`, `aggregated`,
`unattributed_kernels[]`, `warnings[]`). Every quantity carries its unit, either in the field name
(`_ns`, `_bytes`, `_pct`, `_flop`) or, for raw counters, in a `Metric`.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_server.schema.types import CompileMode, RunMode

SCHEMA_VERSION = "1.11"  # 1.1: the timing pass's window, clocks, unprofiled gaps, module coverage
# 1.2: phase (forward/backward/optimizer) on kernels and operators, backward ops tied to the forward op they
# differentiate, call sites and their coverage, the graph breaks of a compiled capture
# 1.3: one rank of a multi-rank run: its place in the world, collectives with their sequence numbers and the
# modules whose gradients a DDP bucket carries, CPU operators' host start
# 1.4: the shortest and longest of the timing pass's windows
# 1.5: the window's host synchronisations and memory copies and sets as events (`runtime_events`), each attributed
# like a kernel, with the GPU idle time after a synchronisation in the window measured without the profiler
# 1.6: whether the compiled code runs under CUDA graph trees (a workload's own mode="reduce-overhead" included)
# 1.7: whether cuDNN's autotuner was on (torch.backends.cudnn.benchmark)
# 1.8: forward work recomputed inside the backward by activation checkpointing (`recomputed`)
# 1.9: the host's own compute: operators that launched no kernel and made no CUDA call (`host_compute_ns`,
#      `host_operators`)
# 1.10: the models whose inputs took several shapes in a script's measured windows (`varying_inputs`)
# 1.11: the iterations DistributedDataParallel timed in the window (`ddp_timed_iterations`) and its waits for their
#       CUDA events (a runtime event's origin `ddp_timing`)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AttributionMethod(str, Enum):
    """How a kernel was tied to the operator that launched it (the confidence ladder)."""

    KINETO_CORRELATION = "kineto_correlation"
    NVTX_ENCLOSURE = "nvtx_enclosure"
    INDUCTOR_PROVENANCE = "inductor_provenance"
    UNATTRIBUTED = "unattributed"


class Confidence(str, Enum):
    HIGH = "high"
    MEDIUM = "medium"
    NONE = "none"


Phase = Literal["forward", "backward", "optimizer"]


class Metric(_Model):
    """One hardware counter or derived value, with the unit the tool reported it in."""

    value: float
    unit: str = Field(description="Unit as reported by the tool, e.g. 'byte', 'nsecond', '%', 'inst'.")


class Attribution(_Model):
    method: AttributionMethod
    confidence: Confidence
    launch_op: str | None = Field(
        default=None, description="Innermost aten op active when the kernel was launched (e.g. aten::addmm)."
    )
    detail: str | None = None


class KernelRecord(_Model):
    """One kernel launch inside the measured window, in launch order."""

    kernel_id: int = Field(description="Launch ordinal within the window (0-based).")
    kernel_name: str
    mangled_name: str | None = None
    device_id: int | None = None
    stream_id: int | None = None
    correlation_id: int | None = None
    start_ns: int = Field(description="GPU start, ns since the start of the window.")
    duration_ns: int = Field(description="GPU duration at real clocks, ns.")
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    module_path: str | None = None
    attribution: Attribution
    metrics: dict[str, Metric] = Field(default_factory=dict)
    propagated_from: int | None = Field(
        default=None, description="kernel_id whose counters were replayed and copied to this launch of its "
        "configuration (see `propagation`)."
    )
    propagation: Literal["same_shapes", "same_work", "nearest_shape"] | None = Field(
        default=None, description="Why the copied counters stand for this launch: an identical launch (its "
        "operator had the same input shapes), the same work (an element-wise kernel over as many elements, a "
        "layout conversion), or the nearest measured shape of its configuration (a shape variant the replay "
        "budget left out: an estimate) (1.5).",
    )
    unprofiled_gap_ns: int | None = Field(
        default=None, description="GPU idle time before this launch in the window measured without the profiler "
        "(median over the timing pass's windows), ns; None where that pass did not run or its kernels did not "
        "join this timeline.",
    )
    phase: Phase | None = Field(
        default=None, description="'forward', 'backward' (launched by an autograd node) or 'optimizer' (inside "
        "an optimizer's step or zero_grad) (schema 1.2).",
    )


class AggregatedMetrics(_Model):
    """Per-operator roll-up of its kernels (None where no kernel reported the counter)."""

    total_duration_ns: int = 0
    kernel_count: int = 0
    dominant_kernel: str | None = None
    dram_bytes_read: float | None = None
    dram_bytes_written: float | None = None
    achieved_occupancy_pct: float | None = None
    tensor_core_active_pct: float | None = None
    l1_hit_rate_pct: float | None = None
    l2_hit_rate_pct: float | None = None
    sm_throughput_pct: float | None = None
    dram_throughput_pct: float | None = None
    flops_by_precision: dict[str, float] = Field(default_factory=dict, description="FLOPs (count) per precision.")
    arithmetic_intensity_flop_per_byte: float | None = None
    cpu_self_time_ns: int | None = Field(default=None, description="CPU self time (CPU-only profiles).")
    cpu_total_time_ns: int | None = Field(default=None, description="CPU inclusive time (CPU-only profiles).")
    cpu_self_time_by_operator_ns: dict[str, int] | None = Field(
        default=None, description="CPU self time of this call and of every operator it called, by operator name "
        "(CPU-only profiles): where the call's time was spent, nested operators included.",
    )


def split_module_path(module_path: str | None) -> list[str]:
    """The modules a `module_path` names: an Inductor kernel fused across modules that share no parent carries them
    comma-joined (`blocks.0.attention,bias.embedding`); none when the path is unknown."""
    if module_path is None:
        return []
    return [p.strip() for p in module_path.split(",")] if "," in module_path else [module_path]


class OperatorRecord(_Model):
    """One call of one PyTorch operator (or one Inductor-fused group) in the window."""

    operator_id: str = Field(description="Stable identity: '<operator_name>#<call_index>'.")
    operator_name: str = Field(description="Bare operator name, e.g. aten::linear; no shapes.")
    call_index: int = Field(description="Nth call of this operator name in the window (0-based).")
    module_path: str | None = Field(default=None, description="nn.Module path, e.g. features.0.conv.")
    input_shapes: list[list[int] | None] | None = None
    input_dtypes: list[str | None] | None = None
    is_fused: bool = False
    fused_operators: list[str] = Field(default_factory=list, description="aten ops an Inductor kernel fused.")
    kernels: list[KernelRecord] = Field(default_factory=list)
    aggregated: AggregatedMetrics = Field(default_factory=AggregatedMetrics)
    phase: Phase | None = Field(default=None, description="The phase of the call's kernels (schema 1.2).")
    call_site: str | None = Field(
        default=None, description="`path:line` of the innermost frame of the user's code (outside torch, the "
        "standard library and site-packages) that made the call; for a backward op, its forward op's (1.2).",
    )
    autograd_node: str | None = Field(
        default=None, description="The autograd node whose backward launched the call, e.g. AddmmBackward0 (1.2).",
    )
    forward_op: str | None = Field(
        default=None, description="The forward operator the backward call differentiates, e.g. aten::linear; its "
        "module and call site are the call's (1.2).",
    )
    compiled_graph: str | None = Field(
        default=None, description="The compiled graph whose call launched it (Inductor's FX-graph-cache key, as "
        "its `## Call CompiledFxGraph` range names it); None outside compiled graphs (1.2).",
    )
    host_start_ns: int | None = Field(
        default=None, description="CPU-only profiles: the call's start on the host, ns since the window start (1.3).",
    )
    collective: str | None = Field(
        default=None, description="The collective this call runs (allreduce, allgather, reducescatter, broadcast, "
        "...), from c10d's, gloo's or NCCL's names; None for compute (1.3).",
    )
    collective_seq: int | None = Field(
        default=None, description="Ordinal of this call among the rank's collectives of its type in the window: "
        "every rank issues them in the same order, so it aligns one call across ranks (1.3).",
    )
    collective_modules: dict[str, float] | None = Field(
        default=None, description="The modules whose gradients (a DDP bucket) the collective carries, each with "
        "its share of the bucket's elements (1.3).",
    )
    recomputed: bool = Field(
        default=False, description="Forward work run again inside the backward by activation checkpointing "
        "(torch.utils.checkpoint): phase backward, no autograd node or forward op; its call site is the same call's "
        "in the forward (1.8).",
    )


class Clocks(_Model):
    """The GPU's clocks: sampled while the window's work ran when the timing pass did, else read before capture."""

    sm_clock_mhz: float | None = Field(default=None, description="Median SM clock while sampled, MHz.")
    memory_clock_mhz: float | None = None
    source: str | None = Field(default=None, description="Where the clocks were read.")
    sm_clock_range_mhz: list[float] | None = Field(default=None, description="[min, median, max] of the samples.")
    memory_clock_range_mhz: list[float] | None = None
    samples: int | None = None


class GraphBreak(_Model):
    """One place where TorchDynamo ended a graph and fell back to Python."""

    reason: str = Field(description="The reason's first line, as Dynamo gives it.")
    location: str = Field(description="`path:line` in the user's code where the graph broke.")
    compile_id: str | None = Field(default=None, description="Dynamo's id of the graph the break ended, e.g. 0/0.")
    detail: str | None = Field(default=None, description="Dynamo's whole explanation, hints included.")


class DdpBucket(_Model):
    """One DDP gradient bucket, in reduction order: the parameters it all-reduces and their modules."""

    ddp: str = Field(description="Path of the DDP instance in the model ('(root)' for the model itself).")
    index: int
    numel: int = Field(description="Elements the bucket carries.")
    parameters: list[str]
    modules: list[str]
    module_numel: dict[str, int] = Field(default_factory=dict, description="Elements of each module's gradients.")


class DistributedInfo(_Model):
    """A rank's place in a torchrun world and what it communicates with."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None = None
    backend: str = Field(description="The process group's backend: nccl or gloo.")
    device: str | None = None
    master_addr: str | None = None
    master_port: str | None = None
    wrapped_by: str | None = Field(default=None, description="'ddp' when the harness wrapped the model.")
    ddp_buckets: list[DdpBucket] = Field(default_factory=list)
    ddp_timed_iterations: list[int] = Field(
        default_factory=list, description="(1.11) The DDP iterations in the pass's windows that DDP timed (its first "
        "10 and every 100th; numbered by the gradient-syncing forwards before them): it waits for their CUDA events.")
    nccl_env: dict[str, str] = Field(default_factory=dict, description="NCCL_*, TORCH_NCCL_* and similar variables.")
    topology: str | None = Field(default=None, description="`nvidia-smi topo -m` of the rank's node (local rank 0).")
    collective_kernels: dict[str, str] = Field(
        default_factory=dict, description="NCCL kernel names seen in the window, each with its collective.")
    ncu_excluded_collectives: bool = Field(
        default=False, description="NCCL kernels were left out of ncu's replay (they carry no counters).")


class CaptureMetadata(_Model):
    """Everything needed to know what was measured, where and how."""

    tool: str = Field(description="Profilers that produced this profile, e.g. 'torch_profiler' or 'nsys+ncu'.")
    gpu_used: bool
    device_name: str | None = None
    device_type: str = Field(description="'cuda' or 'cpu'.")
    sm_count: int | None = None
    compute_capability: str | None = None
    total_memory_bytes: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str
    python_version: str
    python_executable: str
    hostname: str | None = None
    workload: str
    compile_mode: CompileMode
    run_mode: RunMode = Field(description="'inference' (forward under no_grad) or 'train_step'.")
    warmup_iters: int
    iters: int
    seed: int
    command_line: list[str]
    started_at: str
    finished_at: str
    clocks: Clocks = Field(default_factory=Clocks)
    tool_versions: dict[str, str] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    graph_breaks: list[GraphBreak] | None = Field(
        default=None, description="Dynamo's graph breaks while compiling the model (compiled modes; None in "
        "eager), in compile order (schema 1.2).",
    )
    cuda_graph_trees: bool | None = Field(
        default=None, description="Whether a graph compiled for the window runs under Inductor's CUDA graph trees "
        "(mode='reduce-overhead' or triton.cudagraphs, the workload's own torch.compile included); None when "
        "nothing was compiled (1.6).",
    )
    cudnn_benchmark: bool | None = Field(
        default=None, description="Whether cuDNN's autotuner (torch.backends.cudnn.benchmark) was on once the workload "
        "had warmed up: off, cuDNN picks each convolution's kernel by heuristic; None when not recorded (1.7).",
    )
    root_module: str | None = Field(
        default=None, description="The module path naming the model itself (its class name): its own forward's "
        "kernels outside every submodule, and the optimizer's (1.2).",
    )
    varying_inputs: dict[str, int] | None = Field(
        default=None, description="(a script run as it is) the models (root module paths) whose tensor arguments "
        "took several shapes in the measured windows, with how many: a CUDA graph replays one shape (1.10).",
    )
    window_clock_start_ns: int | None = Field(
        default=None, description="The window's start on the capturing tool's clock (Kineto's trace clock, or nsys's "
        "UTC session clock): what lines up the windows of several ranks' profiles (1.3).",
    )
    distributed: DistributedInfo | None = Field(
        default=None, description="One rank of a multi-rank run (torchrun): its place and the facts of its "
        "communication; None for one process (1.3).",
    )


class HostOperatorTime(_Model):
    """The host's own compute in one operator at one place: its calls that launched no kernel and made no CUDA call
    (operators on CPU tensors), outside every other operator, on the window's threads (1.9)."""

    operator_name: str
    module_path: str | None = Field(default=None, description="The innermost module around the calls (an "
                                    "optimizer's step: the module holding its parameters, in a script).")
    call_site: str | None = None
    calls: int
    host_time_ns: int = Field(description="Their host time under the profiler, ns.")


class WindowTotals(_Model):
    """Totals over the measured window."""

    wall_time_ns: int = Field(description="Host wall time of the measured iterations, ns.")
    gpu_busy_time_ns: int | None = Field(default=None, description="Union of kernel intervals, ns (None without GPU).")
    kernel_count: int = 0
    kernel_time_ns: int = Field(default=0, description="Sum of kernel durations, ns.")
    attributed_kernel_time_pct: float | None = None
    high_confidence_kernel_time_pct: float | None = None
    module_path_kernel_time_pct: float | None = Field(
        default=None, description="Share of kernel time whose operator carries a module path, 0-100 (schema 1.1)."
    )
    call_site_kernel_time_pct: float | None = Field(
        default=None, description="Share of kernel time whose operator carries a call site, 0-100 (schema 1.2)."
    )
    kernel_time_by_phase_ns: dict[str, int] | None = Field(
        default=None, description="Kernel time per phase (forward, backward, optimizer), ns (schema 1.2)."
    )
    operator_count: int = 0
    cpu_operator_time_ns: int | None = Field(default=None, description="Sum of top-level CPU op time, ns.")
    gpu_elapsed_ns: int | None = Field(
        default=None, description="GPU time between CUDA events around the window, ns (idle gaps included)."
    )
    kernels_with_counters: int | None = Field(default=None, description="Window kernels that carry ncu counters.")
    measured_counter_kernel_time_pct: float | None = Field(
        default=None, description="Share of kernel time whose launches ncu replayed themselves, 0-100 (1.5).")
    propagated_counter_kernel_time_pct: float | None = Field(
        default=None, description="Share of kernel time carrying counters copied from another launch of its "
        "configuration (`propagated_from`), 0-100 (1.5).")
    nearest_shape_kernel_time_pct: float | None = Field(
        default=None, description="Of that, the share copied from a launch with other input shapes (the nearest "
        "measured one), 0-100 (1.5).")
    no_counter_kernel_time_pct: float | None = Field(
        default=None, description="Share of kernel time without counters, 0-100 (1.5).")
    unprofiled_wall_time_ns: int | None = Field(
        default=None, description="The same window measured with no profiler (CUDA events; median over the timing "
        "pass's windows), ns: comparable with gpu_elapsed_ns. In a CPU-only profile: the host clock, median over "
        "the windows the torch pass timed before its profiled one.",
    )
    unprofiled_gpu_busy_time_ns: int | None = Field(
        default=None, description="Union of kernel intervals in that window (CUPTI activity only), ns.",
    )
    unprofiled_windows: int | None = Field(default=None, description="How many windows the timing pass (a CPU-only "
                                           "profile: the torch pass) measured without the profiler.")
    unprofiled_wall_time_range_ns: list[int] | None = Field(
        default=None, description="The shortest and the longest of those windows (CUDA events; the host clock in a "
        "CPU-only profile), ns: how much the window moves from one iteration to the next (schema 1.4).",
    )
    unprofiled_traced_wall_time_ns: int | None = Field(
        default=None, description="The window under the kernel trace that gives busy time and gaps (CUDA events, "
        "median), ns: CUPTI's launch callbacks slow the host, so its gaps are scaled to the untraced window's idle "
        "time.",
    )
    host_compute_ns: int | None = Field(
        default=None, description="Host time in operator calls that launched no kernel and made no CUDA call, outside "
        "every other operator, on the window's threads, under the profiler, ns: work the host computes itself "
        "(operators on CPU tensors), which no change to launches shortens; None where not read (1.9).",
    )
    host_operators: list[HostOperatorTime] | None = Field(
        default=None, description="The largest of them by operator, module and call site (1.9).",
    )


class RuntimeEvent(_Model):
    """One CUDA API call of the window that synchronises the host with the GPU, or copies or sets memory (1.5)."""

    event_id: int = Field(description="Order of the call in the window (0-based), by its host start.")
    kind: Literal["sync", "memcpy", "memset"]
    api: str = Field(description="e.g. cudaStreamSynchronize, cudaMemcpyAsync, cudaMemsetAsync.")
    start_ns: int = Field(description="Host start of the call, ns since the start of the window.")
    duration_ns: int = Field(description="Host time in the call, ns: for a synchronising call, how long the host "
                             "waited (under the profiler).")
    synchronizing: bool = Field(description="The host waits in the call for the GPU: a synchronisation, a synchronous "
                                "copy, or a copy from the device into pageable host memory.")
    origin: Literal["workload", "harness", "ddp_timing"] = Field(
        description="'harness': a call outside every operator, module and call-site range before the window's "
        "first kernel or after its last (the harness's own synchronisations around the window); 'ddp_timing': a "
        "cudaEventSynchronize outside every operator and line of the workload's in a window holding an iteration "
        "DistributedDataParallel timed (its first 10 and every 100th: it waits for the events of the iteration "
        "before as the forward starts); else 'workload'.")
    gpu_start_ns: int | None = Field(default=None, description="The copy or set on the GPU: start, ns since the "
                                     "window's start.")
    gpu_duration_ns: int | None = None
    bytes: int | None = None
    copy_kind: str | None = Field(default=None, description="HtoD, DtoH, DtoD, HtoH or PtoP (copies).")
    src_memory: str | None = Field(default=None, description="pageable, pinned, device, managed (copies).")
    dst_memory: str | None = None
    sync_type: str | None = Field(default=None, description="The wait as CUPTI recorded it, where it did (stream, "
                                  "event, stream_wait_event, context).")
    operator_id: str | None = Field(default=None, description="The operator call that made it, when that call "
                                    "launched kernels (an `.item()` that only copies has no operator record).")
    operator_name: str | None = Field(default=None, description="The outermost operator around the call.")
    launch_op: str | None = Field(default=None, description="The innermost operator around the call.")
    module_path: str | None = None
    call_site: str | None = Field(default=None, description="`path:line` of the user's code that made it; under "
                                  "torch.compile, where Dynamo's graph break for its operator (`.item()`, "
                                  "`nonzero`) lies, since that operator then runs eagerly between graphs.")
    phase: Phase | None = None
    next_kernel_id: int | None = Field(default=None, description="The first kernel to start on the GPU after the "
                                       "call returned.")
    idle_after_ns: int | None = Field(default=None, description="GPU idle time before that kernel in the profiled "
                                      "window, ns (inflated by instrumentation).")
    unprofiled_idle_after_ns: int | None = Field(
        default=None, description="The same kernel's idle gap in the window measured without the profiler (the "
        "timing pass's `unprofiled_gap_ns`): what a synchronising call costs the GPU there, ns.")


class OperatorAttributedProfile(_Model):
    """profile.json: operators of one measured window with their kernels and counters."""

    schema_version: str = SCHEMA_VERSION
    capture_metadata: CaptureMetadata
    window: WindowTotals
    operators: list[OperatorRecord] = Field(default_factory=list)
    unattributed_kernels: list[KernelRecord] = Field(default_factory=list)
    runtime_events: list[RuntimeEvent] | None = Field(
        default=None, description="The window's host synchronisations and memory copies and sets, in call order; None "
        "where the capture did not read them (before schema 1.5, a CPU-only profile) (1.5).")
    warnings: list[str] = Field(default_factory=list)

    def unattributed_kernel_time_ns(self) -> int:
        """Kernel time of the window's kernels no operator range encloses (`unattributed_kernels`)."""
        return sum(k.duration_ns for k in self.unattributed_kernels)
