"""Pydantic models of the proof files: comparison.json, bench.json and validation_report.json.

These are what `compare`, `bench` and `validate` write and what reports quote. Every time is in ns (field
names say so), every ratio says which way it points: `ratio` is optimized / baseline (below 1 is better for a
time), `speedup` is baseline / optimized (above 1 is better).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_server.schema.types import CompileMode, RunMode

COMPARISON_VERSION = "1.0"
BENCH_VERSION = "2.2"  # 2.2: in turns, the speedup is the median of the paired blocks' ratios
VALIDATION_VERSION = "1.0"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------- comparison.json


class ProfileSummary(_Model):
    """What one side of a comparison is: where and how its profile was captured."""

    path: str | None = None
    workload: str
    device_type: str
    device_name: str | None = None
    gpu_used: bool
    compile_mode: CompileMode
    run_mode: RunMode
    iters: int
    torch_version: str
    tool: str


class TotalDelta(_Model):
    """One window-level quantity on both sides."""

    name: str = Field(description="e.g. 'gpu_kernel_time_ns', 'window_wall_time_ns', 'kernel_count'.")
    baseline: float | None = None
    optimized: float | None = None
    delta: float | None = Field(default=None, description="optimized - baseline.")
    ratio: float | None = Field(default=None, description="optimized / baseline.")
    speedup: float | None = Field(default=None, description="baseline / optimized (time quantities only).")


class OperatorMetrics(_Model):
    """One side of an operator delta (summed over the operators of a fused group)."""

    time_ns: int = Field(description="On the comparison's time basis: GPU kernel time, or CPU time without a GPU.")
    kernel_count: int = 0
    dram_bytes: float | None = Field(default=None, description="DRAM bytes read + written, where ncu measured them.")
    cpu_total_time_ns: int | None = None
    cpu_self_time_ns: int | None = None
    counters: dict[str, float] = Field(
        default_factory=dict, description="Key ncu ratios present on this side (time-weighted over a group)."
    )


class OperatorDelta(_Model):
    """One matched, fused, appeared or disappeared operator."""

    status: Literal["matched", "fused", "appeared", "disappeared"]
    match_rule: Literal["name_module_order", "renamed", "name_order", "fused_names", "fused_module", "none"] = Field(
        description="How the two sides were tied: same (name, module path, call order); same module path and "
        "operator family under another name (aten::conv2d / aten::convolution); same operator family in call "
        "order where one side has no module path (a CUDA graph the workload captured); an optimized fused operator "
        "absorbing baseline operators named in its fused_operators; or by module path alone."
    )
    operator_name: str = Field(description="The optimized side's name (the baseline's when disappeared).")
    module_path: str | None = None
    call_order: int = Field(description="Nth call of (operator_name, module_path) on its side (0-based).")
    baseline_operator_ids: list[str] = Field(default_factory=list)
    optimized_operator_ids: list[str] = Field(default_factory=list)
    absorbed_operators: list[str] = Field(
        default_factory=list, description="Names of the baseline operators a fused operator absorbed, in order."
    )
    baseline: OperatorMetrics | None = None
    optimized: OperatorMetrics | None = None
    time_delta_ns: int = Field(description="optimized - baseline time (a missing side counts as 0).")
    time_ratio: float | None = Field(default=None, description="optimized / baseline time.")


class ModuleDelta(_Model):
    """Per nn.Module path (exact path, not rolled up): time, launches and DRAM bytes on both sides."""

    module_path: str = Field(description="'<no module>' for operators without one, '<unattributed>' for kernels.")
    baseline_time_ns: int = 0
    optimized_time_ns: int = 0
    time_delta_ns: int = 0
    time_ratio: float | None = None
    baseline_kernel_count: int = 0
    optimized_kernel_count: int = 0
    baseline_operator_count: int = 0
    optimized_operator_count: int = 0
    baseline_dram_bytes: float | None = None
    optimized_dram_bytes: float | None = None


class KernelDelta(_Model):
    """Launches and time of one kernel name on both sides."""

    kernel_name: str
    status: Literal["appeared", "disappeared", "changed", "unchanged"] = Field(
        description="appeared/disappeared: present on one side only; changed: launch count differs."
    )
    baseline_count: int = 0
    optimized_count: int = 0
    baseline_time_ns: int = 0
    optimized_time_ns: int = 0


class Comparison(_Model):
    """comparison.json: an optimized profile against its baseline."""

    comparison_version: str = COMPARISON_VERSION
    time_basis: Literal["gpu_kernel_time", "cpu_time"] = Field(
        description="gpu_kernel_time: sums of kernel durations; cpu_time: CPU operator times (CPU-only profiles)."
    )
    baseline: ProfileSummary
    optimized: ProfileSummary
    allow_mismatch: bool = False
    mismatches: list[str] = Field(
        default_factory=list, description="Why the profiles are not like for like (only with allow_mismatch)."
    )
    totals: list[TotalDelta] = Field(default_factory=list)
    match_counts: dict[str, int] = Field(default_factory=dict, description="Operator entries per status.")
    operators: list[OperatorDelta] = Field(default_factory=list)
    modules: list[ModuleDelta] = Field(default_factory=list)
    kernels: list[KernelDelta] = Field(default_factory=list)
    new_casts: list[str] = Field(default_factory=list, description="Cast/copy operators only the optimized side has.")
    warnings: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- bench.json


class ClockReading(_Model):
    """One GPU's clocks as nvidia-smi reported them."""

    gpu_index: int
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None


class ClockObservation(_Model):
    """Clocks observed around (and during) the timed runs; they are never changed."""

    source: Literal["nvidia-smi", "unavailable"]
    before: list[ClockReading] = Field(default_factory=list)
    during: list[ClockReading] = Field(default_factory=list, description="Read when the first timed window began.")
    after: list[ClockReading] = Field(default_factory=list)
    note: str | None = None


class TimingSummary(_Model):
    """Statistics of one side's timed calls, ns per call."""

    samples: int
    median_ns: float
    mean_ns: float
    min_ns: float
    max_ns: float
    stdev_ns: float
    p10_ns: float
    p90_ns: float


Metric = Literal["latency", "back_to_back"]
"""What a time per call means: `latency`, each call alone (timed, then synchronised); `back_to_back`, calls queued
one after another with one synchronisation at the end, the time per call (throughput's inverse)."""


class Measurement(_Model):
    """One side measured in one fresh process (one round)."""

    round: int = Field(description="0-based; rounds alternate the two sides' processes.")
    how_run: str
    first_call_ns: int = Field(description="The first call (compilation included), not part of the samples.")
    warmup_time_ns: int = Field(description="The warm-up calls after the first.")
    latency_ns: list[int] = Field(description="Each call alone: CUDA events around it and a synchronisation after it "
                                  "(the host clock on the CPU), in call order.")
    back_to_back_ns: list[float] = Field(description="Per call, over `queued_calls` calls queued with one "
                                         "synchronisation at the end; one value per block.")
    latency_blocks: list[int] = Field(default_factory=list, description="Timed in turns with the other side: the "
                                      "latency calls of each block, in order (block k: its latency calls, then "
                                      "back_to_back_ns[k]); empty when the process timed its window in one piece.")
    queued_calls: int
    wall_time_s: float = Field(description="The process's whole life: start-up, build and compilation included.")
    cpus: list[int] = Field(default_factory=list, description="The CPU the process ran on as its timed window began "
                            "and ended (Linux), for host-bound timings that differ from one process to the next.")


class BenchSide(_Model):
    """One workload's timings, over its rounds."""

    workload: str
    how_run: str = Field(description="'as written (eager)', a free recipe's name, or 'optimize()'.")
    recipe: str | None = Field(default=None, description="The free recipe this side ran, where it ran one.")
    first_call_ns: int = Field(description="The median first call (compilation included) over the rounds.")
    latency: TimingSummary
    back_to_back: TimingSummary
    rounds: list[Measurement]

    def summary_of(self, metric: Metric) -> TimingSummary:
        """The statistics of `metric`'s samples."""
        return self.latency if metric == "latency" else self.back_to_back


class SpeedupEstimate(_Model):
    """baseline median / optimized median, with a bootstrap confidence interval."""

    point: float
    ci_low: float
    ci_high: float
    ci_level: float = 0.95
    resamples: int
    bootstrap_seed: int
    method: str = ("bootstrap of the ratio of medians: each side's rounds resampled with replacement, then each "
                   "chosen round's calls")
    significant: bool = Field(description="The interval excludes 1.0.")


class BenchResult(_Model):
    """bench.json: a baseline and an optimized workload, each timed in its own fresh processes."""

    bench_version: str = BENCH_VERSION
    method: str = Field(description="How the two sides were timed against each other.")
    baseline: BenchSide
    optimized: BenchSide
    headline: Metric = Field(description="The metric `speedup` and reports state: latency unless asked for "
                             "throughput (back_to_back).")
    latency_speedup: SpeedupEstimate
    back_to_back_speedup: SpeedupEstimate
    device_type: str
    device_name: str | None = None
    timer: Literal["cuda_event", "perf_counter"]
    cpu_threads: int | None = Field(default=None, description="torch.get_num_threads() in the child.")
    torch_version: str
    cuda_version: str | None = None
    python_version: str
    python_executable: str
    rounds: int = Field(description="Processes per side.")
    warmup: int = Field(description="Warm-up calls per process after the first.")
    calls: int = Field(description="At most this many latency calls per process (fewer when the budget is spent).")
    queued: int = Field(description="At most this many calls per back-to-back block.")
    blocks: int = Field(description="Back-to-back blocks per process.")
    budget_s: float = Field(description="Seconds of timed calls each process aims at.")
    input_sets: int = Field(description="Distinct input sets rotated through, per side.")
    seed: int
    baseline_mode: str = Field(description="How the baseline ran: eager (as written), free (the winner of `tier` in "
                               "recipes.json) or a free recipe's name.")
    tier: str | None = Field(default=None, description="The precision tier whose winner was the baseline (free only).")
    recipes_path: str | None = Field(default=None, description="The recipes.json the baseline recipe came from.")
    interleaved: bool = Field(default=False, description="Both sides' processes of a round ran at once, timing "
                              "in turns block by block (the interval pairs each block with the other side's next "
                              "to it); false: one process at a time.")
    orders: list[list[str]] = Field(description="Each round: the order of the two sides' processes, or, interleaved, "
                                    "of their timed blocks.")
    clocks: ClockObservation
    started_at: str
    finished_at: str
    wall_time_s: float
    warnings: list[str] = Field(default_factory=list)

    @property
    def speedup(self) -> SpeedupEstimate:
        """The headline metric's speedup."""
        return self.latency_speedup if self.headline == "latency" else self.back_to_back_speedup


# --------------------------------------------------------------------------- validation_report.json


class OutputError(_Model):
    """One output tensor (or value) of one call, optimized against baseline."""

    seed: int
    input_set: str = Field(description="'a': the workload's own inputs for this seed; 'b': fresh random ones.")
    output: str = Field(description="Where in the output structure, e.g. 'out', 'out[0]', \"out['logits']\".")
    shape: list[int] | None = None
    dtype: str | None = None
    baseline_dtype: str | None = Field(
        default=None, description="The baseline's dtype where it differs: the reduced tier lets a float32/float64 "
        "output come back in bfloat16 or float16, as autocast gives it; compared after upcasting.",
    )
    tolerance_class: str | None = Field(default=None, description="float32, tf32, bfloat16, float16, float64, exact")
    max_abs_error: float | None = None
    max_rel_error: float | None = Field(
        default=None, description="max |opt - ref| / (|ref| + atol/rtol): at most rtol exactly when allclose passes."
    )
    rel_error_percentiles: dict[str, float] | None = Field(
        default=None, description="p50, p90, p99 and p99.9 of that relative error over the output's elements (an "
        "evenly strided sample of at most 2^20 of them): the distribution, not only the maximum.",
    )
    rtol: float | None = None
    atol: float | None = None
    passed: bool
    note: str | None = None


class CheckResult(_Model):
    """One named check of the validation."""

    name: str
    status: Literal["pass", "fail", "skip"]
    passed: bool = Field(description="False only for status 'fail'.")
    detail: str
    outputs: list[OutputError] = Field(default_factory=list)


class ValidationReport(_Model):
    """validation_report.json: is the optimized workload right, and is its speedup plausible."""

    validation_version: str = VALIDATION_VERSION
    baseline: str
    optimized: str
    python_executable: str
    torch_version: str | None = None
    device_type: str | None = None
    device_name: str | None = None
    seeds: list[int]
    backend_name: str | None = None
    recipe: str | None = Field(default=None, description="The free recipe the optimized workload applies (its RECIPE) "
                               "instead of a backend of its own.")
    backend_calls: int | None = Field(default=None, description="Times the registered backend compiled a graph.")
    applied_passes: dict[str, int] = Field(default_factory=dict, description="FX pass -> times applied.")
    tolerances: dict[str, float] = Field(default_factory=dict, description="rtol per tolerance class used.")
    atol_override: float | None = None
    tier: str = Field(default="exact", description="Precision tier validated: exact (fp32 tolerances) or reduced.")
    precision_note: str | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    speedup: float | None = None
    max_plausible_speedup: float | None = None
    checks: list[CheckResult]
    passed: bool
    failed_checks: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
