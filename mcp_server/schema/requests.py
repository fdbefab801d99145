"""The facade's typed requests (`mcp_server.api`): one model per verb, and the option groups they share.

The CLI's arguments and the MCP tools' parameters are made from these fields, their types, bounds, defaults and
descriptions (each written once, here): adding an option is one field here plus its use in the adapter that
consumes it. A path field's `PathRole` tells the MCP face how to resolve it. A field's CLI spelling is
`--<name-with-dashes>` (a boolean that defaults to true: `--no-<name>`) unless a `Flag` in its metadata says
otherwise; a required field is a positional argument.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from mcp_server.schema.flags import Flag, PathRole, Positional, Request
from mcp_server.schema.proof import Metric
from mcp_server.schema.recipes import canonical
from mcp_server.schema.types import Backend, CompileMode, Tier

DEFAULT_TIMEOUT_S = 600.0


def _not_an_option(value: str | None) -> str | None:
    if value is not None and value.startswith("-"):
        raise ValueError(f"{value!r} looks like a command-line option, not a plain value")
    return value


class CaptureOptions(Request):
    """How the harness runs the workload's measured window (every pass of a capture shares them)."""

    compile_mode: Annotated[CompileMode, Field(
        description="cudagraphs = torch.compile(mode='reduce-overhead'); optimized = the workload's own "
        "optimize(model)."
    )] = "eager"
    warmup_iters: Annotated[int, Field(ge=0, description="Iterations before the window.")] = 3
    iters: Annotated[int, Field(ge=1, description="Iterations inside the measured window.")] = 1
    seed: Annotated[int, Field(description="Seed for every RNG (Python, torch, CUDA, NumPy).")] = 0
    train_step: Annotated[bool, Field(
        description="Profile the workload's train_step(model, inputs) instead of a forward under no_grad."
    )] = False
    timeout_s: Annotated[float, Field(
        gt=0, allow_inf_nan=False,
        description="Seconds each capture pass may run (an ncu pass stopped then keeps what it replayed)."
    ), Flag("--timeout")] = DEFAULT_TIMEOUT_S
    nproc_per_node: Annotated[int | None, Field(
        ge=1, description="Launch through torchrun with this many ranks on this node (a GPU each); ranks.json "
        "merges them."
    )] = None
    nnodes: Annotated[str | None, Field(description="torchrun's --nnodes (e.g. 2, or 1:4).")] = None
    node_rank: Annotated[int | None, Field(ge=0, description="torchrun's --node-rank.")] = None
    master_addr: Annotated[str | None, Field(description="torchrun's --master-addr.")] = None
    master_port: Annotated[int | None, Field(ge=1, le=65535, description="torchrun's --master-port.")] = None
    rdzv_backend: Annotated[str | None, Field(description="torchrun's --rdzv-backend (e.g. c10d).")] = None
    rdzv_endpoint: Annotated[str | None, Field(description="torchrun's --rdzv-endpoint (host:port).")] = None
    rdzv_id: Annotated[str | None, Field(description="torchrun's --rdzv-id.")] = None
    dist_backend: Annotated[Literal["nccl", "gloo"] | None, Field(
        description="The process group's backend (default: nccl on CUDA, gloo on the CPU)."
    )] = None
    script: Annotated[bool, Field(
        description="Run the workload as a plain script, unmodified: a step is a loop iteration of optimizer "
        "step()s (or a window_fn call); warmup_iters steps, then iters, then it stops."
    )] = False
    script_args: Annotated[tuple[str, ...], Field(
        description="The script's own arguments (its sys.argv[1:]); on the command line, everything after `--`."
    ), Flag("--script-arg", repeat=True)] = ()
    window_fn: Annotated[str | None, Field(
        description="(script) A step: one call of this function, method (e.g. generate) or nn.Module class; "
        "`backward`: one backward()."
    )] = None
    steps: Annotated[str | None, Field(
        pattern=r"^\d+:\d+$", description="(script) W:A: W warm-up steps, then A in the window "
        "(warmup_iters, iters); a GPU's timing pass needs W + 7A."
    )] = None

    @field_validator("steps", mode="before")
    @classmethod
    def _steps_in_words(cls, value: object) -> object:
        """W:A said in words, before the schema's pattern says it as a regular expression."""
        if isinstance(value, str) and not re.fullmatch(r"\d+:\d+", value):
            raise ValueError(f"{value!r} is not W:A, W warm-up steps then A steps in the window (e.g. 3:1)")
        return value

    @field_validator("nnodes", "master_addr", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "window_fn")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return _not_an_option(value)

    @model_validator(mode="before")
    @classmethod
    def _steps(cls, values: Any) -> Any:
        """`steps` W:A sets warmup_iters and iters (which must then agree with it)."""
        if not isinstance(values, dict) or not isinstance(values.get("steps"), str):
            return values
        parts = values["steps"].split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            return values  # `_steps_in_words` rejects it
        warmup, active = int(parts[0]), int(parts[1])
        for name, value in (("warmup_iters", warmup), ("iters", active)):
            if values.get(name) is not None and values[name] != value:
                raise ValueError(f"steps {values['steps']} and {name}={values[name]} disagree: give one of them")
        return {**values, "warmup_iters": warmup, "iters": active}

    @model_validator(mode="after")
    def _script_only(self) -> CaptureOptions:
        if not self.script and (self.script_args or self.window_fn):
            raise ValueError("script_args and window_fn apply to a script run as it is: add script (--script)")
        if self.script and self.compile_mode != "eager":
            raise ValueError("a script runs as it is written: it compiles what it compiles itself; drop compile_mode")
        if self.script and self.train_step:
            raise ValueError("a script's steps are its own optimizer steps: drop train_step")
        if self.script and self.warmup_iters < 1:
            raise ValueError("a script's window opens after one of its steps: warmup_iters (W of steps W:A) must be "
                             "at least 1")
        return self


TORCHRUN_OPTIONS = ("nnodes", "node_rank", "master_addr", "master_port", "rdzv_backend", "rdzv_endpoint", "rdzv_id")
"""The capture options that are torchrun's own, passed on as they are (the MCP instructions describe them once)."""

WINDOW_OPTIONS = ("compile_mode", "warmup_iters", "iters", "seed", "train_step", "timeout_s")
"""The capture options of one process's window: all the memory pass takes (it records one process)."""


class NcuOptions(Request):
    """What Nsight Compute replays of the window, and which counters it collects beyond the default set."""

    dedupe: Annotated[bool, Field(
        description="Replay each launch configuration once and copy its counters to identical launches; off, "
        "every launch."
    )] = True
    kernel_regex: Annotated[str | None, Field(
        description="Replay only kernels whose mangled name matches (a Triton kernel's is its name)."
    )] = None
    launch_skip: Annotated[int | None, Field(ge=0, description="Skip this many matching launches first.")] = None
    launch_count: Annotated[int | None, Field(ge=0, description="Replay at most this many launches.")] = None
    max_kernels: Annotated[int | None, Field(
        ge=1, description="Stop ncu after this many distinct kernels (in launch order); their identical launches "
        "still get counters."
    )] = None
    metric_set: Annotated[str | None, Field(
        description="Also collect an ncu section set (e.g. full): the SM, memory, L1 and L2 throughputs are then read "
        "exactly."
    ), Flag("--set")] = None
    sections: Annotated[tuple[str, ...], Field(
        description="Also collect these ncu sections (SpeedOfLight: the SM, memory, L1 and L2 throughputs read "
        "exactly)."
    ), Flag("--section", repeat=True)] = ()
    ncu_sudo: Annotated[bool, Field(description="Run ncu through `sudo -n` (never prompts).")] = False
    replay_budget_s: Annotated[float, Field(
        gt=0, allow_inf_nan=False, description="Seconds of ncu replay: configurations (past it, those holding "
        "most time), then shape variants; one left out takes its nearest measured shape's counters."
    ), Flag("--replay-budget")] = 60.0

    @field_validator("kernel_regex", "metric_set")
    @classmethod
    def _plain(cls, value: str | None) -> str | None:
        return _not_an_option(value)

    @field_validator("sections")
    @classmethod
    def _plain_sections(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for section in value:
            _not_an_option(section)
        return value

    @property
    def per_launch_config(self) -> bool:
        """ncu replays each launch configuration once (its per-launch-config filter)."""
        return self.dedupe and self.launch_count is None

    @property
    def filters_launches(self) -> bool:
        """ncu replays a chosen subset of the window's launches (by name, skip or count)."""
        return bool(self.kernel_regex) or self.launch_skip is not None or self.launch_count is not None

    @property
    def whole_window(self) -> bool:
        """The default deduplicated replay of the whole window (shape variants get their own pass behind it)."""
        return self.dedupe and not (self.kernel_regex or self.launch_skip or self.launch_count or self.max_kernels)


class Interpreter(Request):
    """The Python that runs the workload, and why that one."""

    python: Annotated[str, Field(description="The interpreter that runs the workload."), Flag("--python")]
    source: str = Field(
        default="argument",
        description="Why this one: 'argument', 'OPERATOR_PROFILER_PYTHON', 'project .venv', 'PATH' or 'manifest'.",
    )


Top = Annotated[int, Field(ge=1, description="How many operators to list.")]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False, description="Seconds each child process may run."),
                    Flag("--timeout")]
OUTPUT = Flag("--output", short="-o")
OUT_DIR = PathRole("output directory")
LOOP_NOTE = ("; in a workload's own folder, or one holding loop_state.json, the loop checkpoints written are "
             "recorded in loop_state.json (see loop-status)")
Workload = Annotated[Path, Field(description="The .py file defining get_model_and_input()."),
                     PathRole("workload", True)]
Baseline = Annotated[Path, Field(description="The baseline workload .py file."),
                     PathRole("baseline workload", True)]
Optimized = Annotated[Path, Field(description="The optimized workload .py file."),
                     PathRole("optimized workload", True)]
ProfilePath = Annotated[Path, Field(description="A profile.json (or the run directory holding it)."),
                        PathRole("profile")]
BenchJson = Annotated[Path | None, Field(description="bench.json (from bench): the only speedup stated."),
                      Flag("--bench"), PathRole("bench.json")]


class ProfileRequest(Request):
    """profile / run: capture a workload's window into a run directory and assemble profile.json."""

    workload: Workload
    python: Interpreter
    capture: CaptureOptions = CaptureOptions()
    backend: Backend = Field(default="auto", description="auto: nsys + ncu with an NVIDIA GPU, else "
                             "torch.profiler (CPU operator times); or a backend by name.")
    ncu: NcuOptions | None = Field(
        default=None, description="Replay the window under ncu too (the run verb); None: no counters."
    )
    require_counters: bool = Field(
        default=True, description="With ncu options: fail where nsys + ncu cannot run, instead of profiling with "
        "torch.profiler and saying so."
    )
    output: Annotated[Path | None, Field(description="Run directory (default: a fresh one under op_runs/)."),
                      OUTPUT, OUT_DIR] = None
    project: Path = Field(description="The folder whose op_runs/ holds fresh run directories.")
    command_line: list[str] | None = Field(
        default=None, description="The command to record in the manifest (default: the equivalent CLI command)."
    )
    top: Top = 10
    memory: bool = Field(default=False, description="Also run the memory pass after the others (memory.json).")


class MemoryRequest(Request):
    """memory: where every byte at the window's peak comes from (a workload, captured), or memory.json rebuilt from
    a run directory's memory pass (no GPU)."""

    target: Annotated[Path, Field(description="A workload .py to capture (GPU), or a run directory whose memory pass "
                                  "rebuilds memory.json (no GPU)."), Positional("WORKLOAD|RUN_DIR"),
                      PathRole("workload or run directory")]
    python: Interpreter
    capture: CaptureOptions = CaptureOptions()
    output: Annotated[Path | None, Field(description="Run directory (default: a fresh one under op_runs/)."),
                      OUTPUT, OUT_DIR] = None
    project: Path
    command_line: list[str] | None = None
    top: Annotated[int, Field(ge=1, description="How many holders to list.")] = 10


class MapRequest(Request):
    """map: add ncu counters to a run captured with the nsys backend."""

    run_dir: Annotated[Path, Field(description="A run directory captured with backend 'nsys'."),
                       PathRole("run directory")]
    ncu: NcuOptions = NcuOptions()
    timeout_s: Seconds = DEFAULT_TIMEOUT_S
    top: Top = 10


class AssembleRequest(Request):
    """assemble: rebuild profile.json from a run directory's raw artifacts."""

    run_dir: Annotated[Path, Field(description="A run directory (holding manifest.json)."), PathRole("run directory")]
    top: Top = 10


class SummaryRequest(Request):
    """summary: the window and the top operators of a profile (a profile.json or the run directory holding it)."""

    profile: ProfilePath
    top: Top = 10


class OperatorDetailRequest(Request):
    """One operator call of a profile in detail."""

    profile: ProfilePath
    operator_id: str
    max_kernels: Annotated[int, Field(ge=0)] = 50


class KernelDetailRequest(Request):
    """One kernel launch of a profile in detail."""

    profile: ProfilePath
    kernel_id: int


class AnalyzeRequest(Request):
    """analyze: roofline, bottlenecks, stalls, timeline health and ranked opportunities of a profile."""

    profile: ProfilePath
    output: Annotated[Path | None, Field(description="Folder for analysis.json, charts, trace (default: "
                                         "./op_runs/<workload>-analysis-<time>)" + LOOP_NOTE), OUTPUT, OUT_DIR] = None
    project: Path
    measure: Annotated[bool, Field(description="Microbenchmark a GPU missing from the device table."),
                       Flag("--no-microbench")] = True


class CompareRequest(Request):
    """compare: per-operator, per-module and per-kernel deltas of two profiles."""

    baseline: Annotated[Path, PathRole("profile")]
    optimized: Annotated[Path, PathRole("profile")]
    allow_mismatch: bool = Field(default=False, description="Compare different devices or input shapes anyway.")
    output: Annotated[Path | None, Field(description="Folder for comparison.json/.md (default: "
                                         "./op_runs/<workload>-compare-<time>)" + LOOP_NOTE), OUTPUT, OUT_DIR] = None
    project: Path
    top: Annotated[int, Field(ge=1)] = 15
class TimingOptions(Request):
    """How each measurement process times its calls (bench's sides, each recipe of the frontier)."""

    seed: Annotated[int, Field(description="Seed for the model's weights and inputs.")] = 0
    input_sets: Annotated[int, Field(ge=1, description="Input sets rotated between calls (the workload's own, then "
                                     "fresh random values of the same shapes): no call finds its data in cache.")] = 4
    warmup: Annotated[int, Field(ge=1, description="Warm-up calls after the first (compiling) one.")] = 20
    calls: Annotated[int, Field(ge=1, description="Latency: at most this many calls, each timed alone and "
                                "synchronised.")] = 100
    queued: Annotated[int, Field(ge=1, description="Back-to-back: at most this many calls queued with one "
                                 "synchronisation, per block.")] = 200
    blocks: Annotated[int, Field(ge=1, description="Back-to-back blocks per process.")] = 3
    budget_s: Annotated[float, Field(gt=0, allow_inf_nan=False, description="Seconds of timed calls each process "
                                     "aims at: slow calls get fewer (at least 10 each).")] = 3.0
    throughput: Annotated[bool, Field(description="Rank and state speedups by back-to-back time per call "
                                      "(throughput) instead of latency.")] = False

    @property
    def headline(self) -> Metric:
        """The metric speedups are stated in."""
        return "back_to_back" if self.throughput else "latency"


class RecipeTiming(TimingOptions):
    """How each recipe's process times its calls: a shorter budget than bench's (the frontier ranks dozens of
    recipes whose windows take turns on the GPU; bench then measures the winner against the optimized workload)."""

    budget_s: Annotated[float, Field(gt=0, allow_inf_nan=False, description="Seconds of timed calls each process "
                                     "aims at: slow calls get fewer (at least 10 each).")] = 1.0
    runoff: Annotated[int, Field(ge=0, le=8, description="More processes for recipes within 1.15x of a tier's "
                                 "winner, timed by the median (0: none; optimize: 2).")] = 0


def _baseline_mode(value: str) -> str:
    if value in ("eager", "free"):
        return value
    try:
        return canonical(value)
    except ValueError as exc:
        raise ValueError(f"{value!r} is neither eager, free nor a recipe: {exc}") from None


Precision = Annotated[Tier, Field(description="Precision tier: exact keeps fp32 and its tolerances (TF32 off); "
                                  "reduced allows TF32/bf16/fp16, float32 outputs held to 1e-2; fp8 also FP8 GEMMs, "
                                  "outputs held to 0.25.")]
BaselineMode = Annotated[str, Field(
    description="eager (as written), free (the tier's winner in recipes.json) or a recipe (e.g. "
    "reduce-overhead+bf16-cast)."
)]


class BenchRequest(Request):
    """bench: a baseline and an optimized workload, each timed in its own processes, rounds alternating."""

    baseline: Baseline
    optimized: Optimized
    python: Interpreter
    timing: TimingOptions = TimingOptions()
    rounds: Annotated[int, Field(ge=3, description="Processes per side (at least 3).")] = 3
    interleave: bool = Field(default=False, description="A round's two processes time blocks in turns (narrower "
                             "CI, but a side read 6 % faster on an H200).")
    baseline_mode: BaselineMode = "eager"
    tier: Precision = "exact"
    recipes: Annotated[Path | None, PathRole("recipes.json")] = Field(
        default=None, description="recipes.json for `free`.")
    output: Annotated[Path | None, Field(description="Folder for bench.json (bench_vs_free.json against free, "
                                         "bench_vs_<recipe>.json against a recipe; default "
                                         "./op_runs/<name>-bench-<time>)" + LOOP_NOTE), OUTPUT, OUT_DIR] = None
    project: Path
    timeout_s: Seconds = DEFAULT_TIMEOUT_S

    @field_validator("baseline_mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        return _baseline_mode(value)


class RecipesRequest(Request):
    """recipes: the free frontier of a workload, each recipe in its own process, validated and sorted into tiers."""

    workload: Workload
    python: Interpreter
    timing: RecipeTiming = RecipeTiming()
    thorough: bool = Field(default=False, description="Also max-autotune (minutes to compile) and every layout.")
    only: tuple[str, ...] = Field(default=(), description="Only these recipes (repeat the flag or use commas).")
    seeds: Annotated[tuple[int, ...], Field(min_length=1)] = (0, 1, 2)
    jobs: Annotated[int | None, Field(ge=1, description="Processes at a time.")] = None
    output: Annotated[Path | None, Field(description="Folder for recipes.json and frontier.png (default "
                                         "./op_runs/<name>-recipes-<time>)."), OUTPUT, OUT_DIR] = None
    project: Path
    timeout_s: Seconds = DEFAULT_TIMEOUT_S

    @field_validator("only")
    @classmethod
    def _recipes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(canonical(name.strip()) for v in value for name in v.split(",") if name.strip())


class OptimizeRequest(Request):
    """optimize: the floor in one command, the tier's winner of the free frontier as an optimized workload, proven."""

    workload: Workload
    python: Interpreter
    tier: Precision = "exact"
    timing: TimingOptions = TimingOptions()
    recipes: Annotated[Path | None, PathRole("recipes.json")] = Field(
        default=None, description="A recipes.json to reuse.")
    thorough: bool = Field(default=False, description="recipes --thorough (unused with --recipes).")
    output: Annotated[Path | None, Field(description="The folder every file goes into (default: a fresh one "
                                         "under op_runs/)."), OUTPUT, OUT_DIR] = None
    project: Path
    timeout_s: Seconds = DEFAULT_TIMEOUT_S


class ValidateRequest(Request):
    """validate: numerical and behavioural checks of an optimized workload against its baseline."""

    baseline: Baseline
    optimized: Optimized
    python: Interpreter
    seeds: Annotated[tuple[int, ...], Field(min_length=1, description="Seeds for fresh inputs.")] = (0, 1, 2)
    rtol: Annotated[float | None, Field(ge=0, description="Relative tolerance for every dtype.")] = None
    atol: Annotated[float | None, Field(ge=0, description="Absolute tolerance for every dtype.")] = None
    tolerances: Annotated[dict[str, float] | None, Field(description="rtol per dtype class, e.g. bfloat16=2e-2."),
                          Flag("--tolerance", repeat=True)] = None
    run_tests: Annotated[bool, Field(description="Run the generated test_<name>.py beside it."),
                         Flag("--no-tests")] = True
    speedup: float | None = Field(default=None, description="Measured speedup to check for plausibility.")
    bench_json: BenchJson = None
    max_plausible_speedup: Annotated[float | None, Field(ge=0, description="Roofline bound on speedup.")] = None
    analysis: Annotated[Path | None, PathRole("analysis.json")] = Field(
        default=None, description="The baseline's analysis.json (bounds the speedup).")
    tier: Precision = "exact"
    optimizations: Annotated[Path | None, PathRole("optimizations.json")] = Field(
        default=None, description="optimizations.json: each implemented item must fire its own pass.")
    output: Annotated[Path | None, Field(description="Folder for validation_report.json (default: "
                                         "./op_runs/<optimized>-validate-<time>)" + LOOP_NOTE), OUTPUT, OUT_DIR] = None
    project: Path
    timeout_s: Seconds = DEFAULT_TIMEOUT_S


class ReportRequest(Request):
    """report: report.md and OPTIMIZED_WORKLOAD.md, or with `plan` proposal.md and implementation.md."""

    baseline_profile: Annotated[Path, Positional("profile"), PathRole("profile")]
    optimized_profile: Annotated[Path | None, PathRole("profile")] = Field(
        default=None, description="The optimized workload's profile.")
    analysis: Annotated[Path | None, PathRole("analysis.json")] = Field(
        default=None, description="analysis.json: the optimized profile's (report) or the "
                                  "baseline's (plan).")
    baseline_analysis: Annotated[Path | None, PathRole("analysis.json")] = Field(
        default=None, description="The baseline's analysis.json (estimates "
                                           "beside the speedup).")
    comparison: Annotated[Path | None, PathRole("comparison.json")] = Field(
        default=None, description="comparison.json (from compare).")
    bench_json: BenchJson = None
    recipes: Annotated[Path | None, PathRole("recipes.json")] = Field(
        default=None, description="recipes.json (from recipes).")
    bench_vs_free: Annotated[Path | None, PathRole("bench_vs_free.json")] = Field(
        default=None, description="bench_vs_free.json (baseline_mode 'free').")
    validation: Annotated[Path | None, PathRole("validation_report.json")] = Field(
        default=None, description="validation_report.json (from validate).")
    optimizations: Annotated[Path | None, PathRole("optimizations.json")] = Field(
        default=None, description="optimizations.json of the changes made.")
    plan: bool = Field(default=False, description="Validate optimizations.json; write proposal.md and "
                       "implementation.md instead.")
    output: Annotated[Path | None, Field(description="Folder for the documents (default: "
                                         "./op_runs/<workload>-report-<time>)" + LOOP_NOTE), OUTPUT, OUT_DIR] = None
    project: Path


class LoopStatusRequest(Request):
    """loop_status: which stage of the optimization loop on a workload is next (its folder holds the checkpoints)."""

    workload: Annotated[Path, Field(description="The baseline NAME.py; its folder holds the loop's files."),
                        Positional("WORKLOAD"), PathRole("workload", True)]


class PreflightRequest(Request):
    """preflight: can this machine profile, under this interpreter?"""

    python: Interpreter
    quick: bool = Field(default=False, description="Find torch without importing it; skip the tools' versions.")
