"""operator-profiler: the command-line face of the engine (`mcp_server.api`).

Each subcommand parses its arguments into the verb's typed request, runs the verb with a progress sink that
shows its phases on stderr (one updating line on a terminal, plain lines otherwise; none with --quiet; the
children's own output too with --verbose, which every pass keeps in its log anyway), and prints the result. The flags of
the capture and ncu option groups are made from their request models' fields.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from mcp_server import __version__, api
from mcp_server.cli_text import (
    format_loop_status,
    format_modules_by_phase,
    format_ranks,
    format_top_operators,
    format_window,
)
from mcp_server.errors import ProfilerError, from_os_error
from mcp_server.process.child import Terminated, stopping_children_on_signals
from mcp_server.progress import is_phase
from mcp_server.proof.validate import parse_seeds, parse_tolerances
from mcp_server.schema.flags import cli_flag, usage_error
from mcp_server.schema.requests import (
    WINDOW_OPTIONS,
    AnalyzeRequest,
    AssembleRequest,
    BenchRequest,
    CaptureOptions,
    CompareRequest,
    Interpreter,
    LoopStatusRequest,
    MapRequest,
    MemoryRequest,
    NcuOptions,
    OptimizeRequest,
    PreflightRequest,
    ProfileRequest,
    RecipesRequest,
    RecipeTiming,
    ReportRequest,
    SummaryRequest,
    TimingOptions,
    ValidateRequest,
)
from mcp_server.schema.results import ProfileRun, ValidateToolResult
from mcp_server.schema.types import BACKENDS, TIERS

M = TypeVar("M", bound=BaseModel)
_OPTION_GROUPS = (CaptureOptions, NcuOptions, TimingOptions, BenchRequest, RecipesRequest, OptimizeRequest)
MEMORY_FLAG = ("also run the memory pass after the others (alone on the GPU): memory.json, where every byte at the "
               "window's peak comes from")
PROFILE_DESCRIPTION = (
    "Capture WORKLOAD's measured window into a run directory and write profile.json. WORKLOAD defines "
    "get_model_and_input() (the fast path), or with --script is any script, run unmodified with the arguments after "
    "`--` (`--script train.py -- --epochs 2`): a step is one optimizer step() (or, with --window-fn NAME, one call of "
    "that function or nn.Module class); --steps W:A warms up W steps, measures A and stops the script.")
RUN_DESCRIPTION = (
    " ncu replays the window's kernels within --replay-budget seconds (default 60): every launch configuration first, "
    "then shape variants by the module calls that launch them, spread over the window; a variant left out takes the "
    "counters of the nearest measured shape of its configuration.")
LOOP_NOTE = ("; in a workload's own folder, or one holding loop_state.json, the loop checkpoints written are "
             "recorded in loop_state.json (see loop-status)")


# --------------------------------------------------------------------------------------------- option groups


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel], only: tuple[str, ...] | None = None) -> None:
    """One flag per field of `model` (or per field named in `only`): its spelling, its description as help; values
    are checked by the model."""
    for name, field in model.model_fields.items():
        if only is not None and name not in only:
            continue
        flag = cli_flag(name, field)
        help_text = (field.description or "").replace("%", "%%")
        if field.annotation is bool:
            action = "store_false" if field.default is True else "store_true"
            parser.add_argument(flag.name, dest=name, action=action, default=None, help=help_text)
            continue
        kinds = [k for k in get_args(field.annotation) if k is not type(None)] or [field.annotation]
        convert = next((k for k in (int, float) if k in kinds), str)
        default = f" (default {field.default})" if field.default not in (None, ()) else ""
        metavar = {int: "N", float: "SECONDS" if name.endswith("_s") else "X"}.get(convert, name.upper())
        parser.add_argument(flag.name, dest=name, type=convert, default=None, help=help_text + default,
                            action="append" if flag.repeat else "store", metavar=metavar)


def options_from(args: argparse.Namespace, model: type[M], **values: Any) -> M:
    """The request or option group `model` as the command line set it (unset flags keep the model's defaults),
    with `values` for the fields the face sets itself."""
    given: dict[str, Any] = {}
    for name in model.model_fields:
        value = getattr(args, name, None)
        if value is not None and name not in values:
            given[name] = tuple(value) if isinstance(value, list) else value
    return build(model, **given, **values)


def build(model: type[M], **values: Any) -> M:
    """A request, or the UsageError naming the flag that made it invalid."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise usage_error(exc, _spelling) from exc


def _spelling(name: str) -> str:
    for group in _OPTION_GROUPS:
        if name in group.model_fields:
            return cli_flag(name, group.model_fields[name]).name
    return "--" + name.replace("_", "-")


# --------------------------------------------------------------------------------------------- printing


class Status:
    """The CLI's progress sink: phase lines on stderr, rewriting one line on a terminal.

    Lines are handed to a writer thread and never block the engine: when stderr is not being read (a stuck pipe
    reader), lines beyond a bounded queue are dropped and counted, and time limits keep being enforced."""

    QUEUED = 1000
    DRAIN_S = 5.0

    def __init__(self, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.quiet, self.verbose = quiet, verbose
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.dropped = 0
        self._open = False
        self._lines: queue.Queue[tuple[bool, str]] = queue.Queue(self.QUEUED)
        self._writer = threading.Thread(target=self._write, name="cli-status", daemon=True)
        self._writer.start()

    def __call__(self, line: str) -> None:
        phase = is_phase(line)
        if (phase and self.quiet) or (not phase and not self.verbose):
            return
        try:
            self._lines.put_nowait((phase, line))
        except queue.Full:
            self.dropped += 1

    def _write(self) -> None:
        while True:
            phase, line = self._lines.get()
            try:
                if phase and self.tty:
                    width = shutil.get_terminal_size().columns - 1
                    self.stream.write(f"\r\033[K[operator-profiler] {line}"[: width + 4])
                    self._open = True
                else:
                    self._close_line()
                    self.stream.write(f"[operator-profiler] {line}\n" if phase else f"  {line}\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            finally:
                self._lines.task_done()

    def _close_line(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False

    def end(self) -> None:
        """Let the queued lines out (for a few seconds at most) and close the updating line."""
        deadline = time.monotonic() + self.DRAIN_S
        while self._lines.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self._close_line()
            if self.dropped:
                self.stream.write(f"[operator-profiler] {self.dropped} progress lines were not shown (stderr was "
                                  "not read fast enough)\n")
                self.dropped = 0
            self.stream.flush()
        except (OSError, ValueError):
            pass


_STATUS = Status()


def _print(*lines: str) -> None:
    _STATUS.end()
    for line in lines:
        print(line)


def _print_profile(result: ProfileRun) -> int:
    _print(format_window(result.profile, result.window))
    for warning in result.warnings:
        _print(f"warning: {warning}")
    _print("")
    _print(format_top_operators(result.top_operators, result.profile.gpu_used))
    if result.ranks is not None:
        _print("\n" + format_ranks(result.ranks))
        _print(f"\nprofiles: {result.run_dir}/rank<R>/profile.json (above: {result.profile_path})")
        _print(f"ranks: {result.ranks_path}")
        return 0
    _print(f"\nprofile: {result.profile_path}")
    if result.memory_path:
        from mcp_server.memory.run import load_memory
        from mcp_server.memory.text import memory_lines

        memory = load_memory(Path(result.run_dir))
        _print("", *(memory_lines(memory, Path(result.memory_path)) if memory is not None else []))
    return 0


def _print_validation(result: ValidateToolResult) -> None:
    _print(result.summary)
    for check in result.checks:
        _print(f"  [{check.status:4}] {check.name}: {check.detail}")
    for warning in result.warnings:
        _print(f"  warning: {warning}")


# --------------------------------------------------------------------------------------------- commands


def _interpreter(args: argparse.Namespace) -> Interpreter:
    return build(Interpreter, python=args.python, source="argument")


def cmd_profile(args: argparse.Namespace, argv: list[str], counters: bool = False) -> int:
    """capture -> run directory -> profile.json, then the top-operators table."""
    capture = options_from(args, CaptureOptions)
    if args.script_args_after:  # `-- ARGS...`: the script's own arguments
        capture = build(CaptureOptions, **{**capture.model_dump(exclude_defaults=True),
                                           "script_args": capture.script_args + tuple(args.script_args_after)})
    req = build(ProfileRequest, workload=args.workload, python=_interpreter(args), capture=capture,
                backend=args.backend, ncu=options_from(args, NcuOptions) if counters else None, require_counters=False,
                output=args.output, project=Path.cwd(), command_line=["operator-profiler", *argv], memory=args.memory)
    return _print_profile(api.profile(req, _STATUS))


def cmd_memory(args: argparse.Namespace) -> int:
    """The memory pass of a workload (or memory.json rebuilt from a run directory): the peak and who holds it."""
    req = build(MemoryRequest, target=args.target, python=_interpreter(args),
                capture=options_from(args, CaptureOptions), output=args.output, project=Path.cwd(), top=args.top)
    result = api.memory(req, _STATUS)
    _print(result.summary)
    if result.chart_path:
        _print(f"chart: {result.chart_path}")
    _print(f"snapshot: {result.snapshot_path} (opens in https://pytorch.org/memory_viz)")
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    """Add ncu counters to a run directory captured with the nsys backend."""
    req = build(MapRequest, run_dir=args.run_dir, ncu=options_from(args, NcuOptions), timeout_s=args.timeout)
    return _print_profile(api.map_run(req, _STATUS))


def cmd_assemble(args: argparse.Namespace) -> int:
    """Rebuild profile.json from the raw artifacts (no GPU needed)."""
    return _print_profile(api.assemble(build(AssembleRequest, run_dir=args.run_dir), _STATUS))


def cmd_summary(args: argparse.Namespace) -> int:
    """Print the window paragraph and top-operators table of an existing profile.json."""
    result = api.summary(build(SummaryRequest, profile=args.profile, top=args.top))
    _print(format_window(result.profile, result.window))
    _print("")
    _print(format_top_operators(result.operators, result.profile.gpu_used))
    if result.modules_by_phase:
        _print("", format_modules_by_phase(result.modules_by_phase))
    if result.memory:
        _print("", result.memory)
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check GPU, driver, torch/CUDA, nsys, ncu and counter permission; exit 1 if any check failed."""
    result = api.preflight(build(PreflightRequest, python=_interpreter(args), quick=args.quick))
    _print(result.summary)
    return 0 if result.ok else 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """Roofline, bottleneck classes, stalls, timeline health and ranked opportunities of a profile."""
    result = api.analyze(build(AnalyzeRequest, profile=args.profile, output=args.output, project=Path.cwd(),
                               measure=not args.no_microbench), _STATUS)
    _print(result.summary)
    _print(f"\nanalysis: {result.analysis_path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Per-operator and per-module deltas of two profiles: comparison.json and comparison.md."""
    result = api.compare(build(CompareRequest, baseline=args.baseline, optimized=args.optimized,
                               allow_mismatch=args.allow_mismatch, output=args.output,
                               project=Path.cwd()))
    _print(result.summary)
    for path in (result.comparison_path, result.markdown_path):
        _print(f"wrote {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Each side in its own processes, rounds alternating; the speedups with their confidence intervals."""
    req = options_from(args, BenchRequest, baseline=args.baseline, optimized=args.optimized,
                       python=_interpreter(args), timing=options_from(args, TimingOptions), project=Path.cwd())
    result = api.bench(req, _STATUS)
    _print(result.summary)
    for warning in result.warnings:
        _print(f"warning: {warning}")
    _print(f"wrote {result.bench_path}")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    """The free frontier: every recipe timed in its own process and validated; the winner of each tier."""
    req = options_from(args, RecipesRequest, workload=args.workload, python=_interpreter(args),
                       timing=options_from(args, RecipeTiming), seeds=parse_seeds(args.seeds), project=Path.cwd())
    result = api.recipes(req, _STATUS)
    _print(result.summary)
    for warning in result.warnings:
        _print(f"warning: {warning}")
    _print(f"wrote {result.recipes_path}" + (f" and {result.frontier_chart}" if result.frontier_chart else ""))
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    """The floor in one command: the tier's frontier winner as an optimized workload, validated, benched, reported."""
    req = options_from(args, OptimizeRequest, workload=args.workload, python=_interpreter(args),
                       timing=options_from(args, TimingOptions), project=Path.cwd())
    result = api.optimize(req, _STATUS)
    _print(result.summary)
    for warning in result.warnings:
        _print(f"warning: {warning}")
    _print(f"wrote {len(result.files)} files into {result.out_dir}")
    return 0 if result.validation_passed else 1


def cmd_validate(args: argparse.Namespace) -> int:
    """Numerical and behavioural checks of an optimized workload; exit 1 when a check fails."""
    req = build(ValidateRequest, baseline=args.baseline, optimized=args.optimized, python=_interpreter(args),
                seeds=parse_seeds(args.seeds), rtol=args.rtol, atol=args.atol,
                tolerances=parse_tolerances(args.tolerance or []), run_tests=not args.no_tests, speedup=args.speedup,
                bench_json=args.bench, max_plausible_speedup=args.max_plausible_speedup, analysis=args.analysis,
                tier=args.tier, optimizations=args.optimizations, output=args.output, project=Path.cwd(),
                timeout_s=args.timeout)
    result = api.validate(req, _STATUS)
    _print_validation(result)
    _print(f"wrote {result.report_path}")
    return 0 if result.passed else 1


def cmd_report(args: argparse.Namespace) -> int:
    """Render the documents and print their paths."""
    req = build(ReportRequest, baseline_profile=args.profile, optimized_profile=args.optimized_profile,
                analysis=args.analysis, baseline_analysis=args.baseline_analysis, comparison=args.comparison,
                bench_json=args.bench, recipes=args.recipes, bench_vs_free=args.bench_vs_free,
                validation=args.validation, optimizations=args.optimizations, plan=args.plan,
                output=args.output, project=Path.cwd())
    for path in api.report(req).files:
        _print(f"wrote {path}")
    return 0


def cmd_loop_status(args: argparse.Namespace) -> int:
    """Which stage of the optimization loop on a workload is next, and why (exit 0 whatever the state)."""
    result = api.loop_status(build(LoopStatusRequest, workload=args.workload))
    _print(result.model_dump_json(indent=1) if args.json else format_loop_status(result))
    return 0


# --------------------------------------------------------------------------------------------- the parser


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line with a remedy like every other error of the tool (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"operator-profiler: error: {message} — see `{self.prog} --help`\n")


def _count(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        number = int(value)
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}")
        return number

    return parse


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", type=Path, help="Python file with get_model_and_input() (or an NvtxCapture window), "
                   "or with --script any script, run as it is: `--script train.py -- ARGS...`")
    p.add_argument("--output", "-o", type=Path, help="run directory (default: ./op_runs/<workload>-<time>)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the workload (default: this one, %(default)s)")
    add_options(p, CaptureOptions)
    _add_output_options(p)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="show no progress, only the result")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also show the workload's and the profilers' own output (each pass's output.log keeps it)")


def _add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", type=Path, help="the baseline profile.json (or its run directory)")
    p.add_argument("--optimized-profile", type=Path, help="profile.json of the optimized workload")
    p.add_argument("--analysis", type=Path, help="analysis.json (residual opportunities)")
    p.add_argument("--baseline-analysis", type=Path,
                   help="the baseline's analysis.json: its estimates and speed of light beside the measured speedup "
                        "(default: the analysis optimizations.json names, when it exists)")
    p.add_argument("--comparison", type=Path, help="comparison.json of the two profiles")
    p.add_argument("--bench", type=Path, help="bench.json: the only source of the stated speedup")
    p.add_argument("--recipes", type=Path, help="recipes.json: the free frontier measured on the same GPU")
    p.add_argument("--bench-vs-free", type=Path,
                   help="bench_vs_free.json: the optimized workload against the winner of its tier of the frontier")
    p.add_argument("--validation", type=Path, help="validation_report.json")
    p.add_argument("--optimizations", type=Path, help="optimizations.json (what was planned, applied or not)")
    p.add_argument("--plan", action="store_true",
                   help="render proposal.md and implementation.md from PROFILE and --optimizations instead")
    p.add_argument("--output", "-o", type=Path,
                   help="folder for the documents (default: ./op_runs/<workload>-report-<time>)" + LOOP_NOTE)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog="operator-profiler",
        description="Attribute every CUDA kernel of a PyTorch workload to the operator and module that launched it.",
    )
    parser.add_argument("--version", action="version", version=f"operator-profiler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("profile", help="capture a workload's measured window and write profile.json (on a GPU, "
                       "also timed with no profiler)", description=PROFILE_DESCRIPTION)
    _add_capture_options(p)
    p.add_argument("--backend", default="auto",
                   help=f"{' | '.join(BACKENDS)}: auto uses nsys when an NVIDIA GPU, nsys and ncu are present, "
                   "else torch.profiler")
    p.add_argument("--memory", action="store_true", help=MEMORY_FLAG)
    p = sub.add_parser("run", help="profile with nsys, time the window with no profiler, replay with ncu for counters",
                       description=PROFILE_DESCRIPTION + RUN_DESCRIPTION)
    _add_capture_options(p)
    p.add_argument("--memory", action="store_true", help=MEMORY_FLAG)
    add_options(p, NcuOptions)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    p = sub.add_parser(
        "memory", help="where every byte at the window's peak comes from: memory.json (CUDA allocator history)",
        description="Run the workload's window once more with the CUDA caching allocator's history recorded (Python "
        "stacks), in the same harness, compile mode and run mode, and attribute every block live at the peak to its "
        "operator, module, phase (forward, backward, optimizer), line and category (parameter, gradient, optimizer "
        "state, activation, temporary, workspace, input/output, retained). Writes memory.json, memory_timeline.png "
        "and the allocator's snapshot into the run directory. Given a run directory instead, rebuilds memory.json "
        "from its files (no GPU). Needs an NVIDIA GPU to capture.")
    p.add_argument("target", type=Path, metavar="WORKLOAD|RUN_DIR",
                   help="a workload with get_model_and_input(), or a run directory holding a memory pass")
    p.add_argument("--output", "-o", type=Path, help="run directory (default: ./op_runs/<workload>-memory-<time>)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the workload (default: this one, %(default)s)")
    add_options(p, CaptureOptions, WINDOW_OPTIONS)
    p.add_argument("--top", type=_count(1), default=10, help="how many holders to list (default 10)")
    _add_output_options(p)
    p = sub.add_parser("map", help="replay a captured run's kernels under ncu and rebuild profile.json")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the ncu pass (default 600)")
    add_options(p, NcuOptions)
    _add_output_options(p)
    p = sub.add_parser("assemble", help="rebuild RUN_DIR/profile.json from its raw artifacts (no GPU needed)")
    p.add_argument("run_dir", type=Path)
    p = sub.add_parser("analyze", help="diagnose a profile: roofline, bottlenecks, stalls, ranked opportunities")
    p.add_argument("profile", type=Path, help="a profile.json (or its run directory)")
    p.add_argument("--output", "-o", type=Path,
                   help="folder for analysis.json, charts, trace (default: ./op_runs/<workload>-analysis-<time>)"
                        + LOOP_NOTE)
    p.add_argument("--no-microbench", action="store_true",
                   help="for a GPU missing from knowledge/devices.yaml, do not measure its peaks")
    p = sub.add_parser("compare", help="per-operator deltas of two profile.json (comparison.json + .md)")
    p.add_argument("baseline", type=Path)
    p.add_argument("optimized", type=Path)
    p.add_argument("--output", "-o", type=Path,
                   help="folder for comparison.json/.md (default: ./op_runs/<workload>-compare-<time>)" + LOOP_NOTE)
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare profiles of different devices or input shapes anyway")
    p = sub.add_parser(
        "bench", help="time two workloads, each in its own processes; speedups with 95%% confidence intervals",
        description="Time BASELINE (as written, a free recipe, or the winner of a tier of the free frontier) against "
        "OPTIMIZED: each side in its own fresh processes, never two at once, rounds alternating the sides and "
        "flipping their order every round. Each process reports latency (each call alone, synchronised) and "
        "back-to-back time per call; the headline is latency unless --throughput.")
    p.add_argument("baseline", type=Path)
    p.add_argument("optimized", type=Path)
    p.add_argument("--python", default=sys.executable, help="interpreter that runs both (%(default)s)")
    add_options(p, BenchRequest, only=("rounds", "baseline_mode", "tier", "recipes", "timeout_s"))
    add_options(p, TimingOptions)
    p.add_argument("--output", "-o", type=Path,
                   help="folder for bench.json (bench_vs_free.json against free, bench_vs_<recipe>.json against a "
                        "recipe; default ./op_runs/<name>-bench-<time>)" + LOOP_NOTE)
    _add_output_options(p)
    p = sub.add_parser(
        "recipes", help="measure the free frontier: every free recipe timed in its own process and validated",
        description="Run WORKLOAD under every recipe a user can paste in a few lines (torch.compile modes, TF32, "
        "bf16/fp16 autocast, the whole model cast to bf16/fp16, channels_last, cuDNN's autotuner), each in its own "
        "process, validated against fp32 eager over several seeds and sorted into the exact or reduced tier; writes "
        "recipes.json and frontier.png and prints the winner of each tier with its lines of code.")
    p.add_argument("workload", type=Path, help="Python file with get_model_and_input()")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the workload (%(default)s)")
    add_options(p, RecipesRequest, only=("thorough", "only", "jobs", "timeout_s"))
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds each recipe is validated on (default 0,1,2)")
    add_options(p, RecipeTiming)
    p.add_argument("--output", "-o", type=Path,
                   help="folder for recipes.json and frontier.png (default ./op_runs/<name>-recipes-<time>)")
    _add_output_options(p)
    p = sub.add_parser(
        "optimize", help="the floor in one command: the tier's free-frontier winner as an optimized workload, proven",
        description="Profile WORKLOAD, measure its free frontier, write the tier's winner as <name>_optimized.py "
        "(plain code in optimize(model)), bench it against eager and against the winner (each side in its own "
        "processes), validate it, profile the optimized workload, compare and render report.md and "
        "OPTIMIZED_WORKLOAD.md: every file in the output folder, none beside the workload. Exit 1 when validation "
        "fails.")
    p.add_argument("workload", type=Path, help="Python file with get_model_and_input()")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the workload (%(default)s)")
    add_options(p, OptimizeRequest, only=("tier", "recipes", "thorough", "timeout_s"))
    add_options(p, TimingOptions)
    p.add_argument("--output", "-o", type=Path,
                   help="folder for every file (default ./op_runs/<name>-optimize-<time>)")
    _add_output_options(p)
    p = sub.add_parser("validate", help="check an optimized workload against its baseline (validation_report.json)")
    p.add_argument("baseline", type=Path)
    p.add_argument("optimized", type=Path)
    p.add_argument("--python", default=sys.executable, help="interpreter that runs both (%(default)s)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds for fresh inputs (default 0,1,2)")
    p.add_argument("--rtol", type=float, help="relative tolerance for every dtype")
    p.add_argument("--atol", type=float, help="absolute tolerance for every dtype")
    p.add_argument("--tolerance", action="append", help="per-dtype-class tolerance, e.g. bfloat16=2e-2 (repeatable)")
    p.add_argument("--no-tests", action="store_true", help="do not run the workload's generated pytest file")
    p.add_argument("--speedup", type=float, help="measured speedup to check for plausibility")
    p.add_argument("--bench", type=Path, help="bench.json whose speedup to check for plausibility")
    p.add_argument("--max-plausible-speedup", type=float, help="roofline bound above which a speedup is suspect")
    p.add_argument("--analysis", type=Path,
                   help="the baseline's analysis.json: its speed of light is the bound when "
                        "--max-plausible-speedup is not given")
    p.add_argument("--tier", choices=TIERS, default="exact",
                   help="precision tier: exact keeps fp32 tolerances and dtypes; reduced holds float32 outputs to "
                        "1e-2 (BF16/FP16/TF32 compute) unless --tolerance names the class, and accepts them "
                        "returned in float16/bfloat16, compared after upcasting (default exact)")
    p.add_argument("--optimizations", type=Path,
                   help="optimizations.json: each implemented item must fire its own pass (check planned_passes)")
    p.add_argument("--output", "-o", type=Path,
                   help="folder for validation_report.json (default: ./op_runs/<optimized>-validate-<time>)"
                        + LOOP_NOTE)
    p.add_argument("--timeout", type=float, default=600.0)
    _add_output_options(p)
    p = sub.add_parser("report", help="render report.md and OPTIMIZED_WORKLOAD.md (or, with --plan, the proposal)")
    _add_report_arguments(p)
    p = sub.add_parser("preflight", help="check GPU, driver, torch/CUDA, nsys, ncu and counter permission")
    p.add_argument("--python", default=sys.executable, help="interpreter that will run workloads (%(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="only find torch under that interpreter, without importing it, and skip the tools' versions")
    p = sub.add_parser(
        "loop-status", help="which stage of the /optimize loop on a workload is next, and why",
        description="Judge every stage of the optimization loop on WORKLOAD from the checkpoint files in its folder: "
        "done, missing, stale (an input changed since: input hashes from loop_state.json where a tool recorded the "
        "file, else modification times) or failed (validation_report.json did not pass). Prints the next stage, the "
        "--from= value to resume with, and which files are reused and which written again. Exit status 0 whatever "
        "the loop's state; 1 when WORKLOAD is missing or loop_state.json is unreadable.")
    p.add_argument("workload", type=Path, metavar="WORKLOAD",
                   help="the baseline workload NAME.py; its folder holds the checkpoints")
    p.add_argument("--json", action="store_true", help="print the result as JSON (the loop_status tool's output)")
    p = sub.add_parser("summary", help="print the top-operators table of a profile.json")
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=_count(1), default=10, help="how many operators (default 10)")
    return parser


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "map": cmd_map, "assemble": cmd_assemble, "analyze": cmd_analyze, "compare": cmd_compare, "bench": cmd_bench,
    "recipes": cmd_recipes, "optimize": cmd_optimize,
    "validate": cmd_validate, "report": cmd_report, "preflight": cmd_preflight, "summary": cmd_summary,
    "loop-status": cmd_loop_status, "memory": cmd_memory,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors with a remedy, exit 1; 130 on Ctrl-C."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # profile|run --script SCRIPT -- ARGS...: everything after the first `--` is the script's own command line
    ours, after = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = build_parser().parse_args(ours)
    if after and args.command not in ("profile", "run"):
        build_parser().error(f"arguments after `--` are a script's: only profile and run take them ({after[0]!r})")
    args.script_args_after = after
    global _STATUS
    _STATUS = Status(quiet=getattr(args, "quiet", False), verbose=getattr(args, "verbose", False))
    try:
        with stopping_children_on_signals():
            if args.command in ("profile", "run"):
                return cmd_profile(args, argv, counters=args.command == "run")
            return COMMANDS[args.command](args)
    except ProfilerError as exc:
        _STATUS.end()
        print(f"operator-profiler: error: {exc.one_line()}", *exc.details, sep="\n", file=sys.stderr)
        return 1
    except OSError as exc:
        _STATUS.end()
        print(f"operator-profiler: error: {from_os_error(exc).one_line()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _STATUS.end()
        print("operator-profiler: interrupted; its child processes were stopped", file=sys.stderr)
        return 130
    except Terminated as exc:
        _STATUS.end()
        print(f"operator-profiler: stopped by {exc}; its child processes were stopped", file=sys.stderr)
        return 128 + exc.signum


if __name__ == "__main__":
    sys.exit(main())
