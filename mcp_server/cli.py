"""operator-profiler: the command-line face of the engine (`mcp_server.api`).

Each subcommand parses its arguments into the verb's typed request, runs the verb with a progress sink that
shows its phases on stderr (one updating line on a terminal, plain lines otherwise; none with --quiet; the
children's own output too with --verbose, which every pass keeps in its log anyway), and prints the result. Every
subcommand's arguments are made from its request model's fields (`add_options`): spelling, type, default, and the
field's description as help; only --python, --quiet, --verbose, --json and --version are the command line's own.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import sys
import threading
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn, TextIO, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from mcp_server import __version__, api
from mcp_server.backends.registry import backend_choices
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
from mcp_server.schema.flags import FACE_SET, Positional, cli_flag, option_group, usage_error
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

M = TypeVar("M", bound=BaseModel)
UNIONS = (typing.Union, types.UnionType)
MODELS = (CaptureOptions, NcuOptions, TimingOptions, ProfileRequest, MemoryRequest, MapRequest, AssembleRequest,
          SummaryRequest, AnalyzeRequest, CompareRequest, BenchRequest, RecipesRequest, OptimizeRequest,
          ValidateRequest, ReportRequest, LoopStatusRequest, PreflightRequest)
"""The request models and option groups whose fields are the CLI's arguments (a bad value names its flag)."""
PROFILE_DESCRIPTION = (
    "Capture WORKLOAD's measured window into a run directory and write profile.json. WORKLOAD defines "
    "get_model_and_input() (the fast path), or with --script is any script, run unmodified with the arguments after "
    "`--` (`--script train.py -- --epochs 2`): a step is one iteration of its optimizers' step() calls (or, with "
    "--window-fn NAME, one call of that function or nn.Module class); --steps W:A warms up W steps, measures A "
    "and stops the script. A DDP script torchrun launches takes --nproc-per-node N; one that starts its ranks with "
    "torch.multiprocessing.spawn is launched through torchrun by itself.")
RUN_DESCRIPTION = (
    " ncu replays the window's kernels within --replay-budget seconds (default 60): every launch configuration first, "
    "then shape variants by the module calls that launch them, spread over the window (a second ncu pass, whose "
    "warm-up is paid from the budget); a variant left out takes the counters of the nearest measured shape of its "
    "configuration.")


# --------------------------------------------------------------------------------------------- option groups


def add_options(parser: argparse.ArgumentParser, model: type[BaseModel], only: tuple[str, ...] | None = None,
                skip: tuple[str, ...] = (), shown: dict[str, tuple[str, ...]] | None = None) -> None:
    """One argument per field of `model` that the command line sets (or per field named in `only`, less `skip`): a
    required field is a positional, any other a flag spelt by `cli_flag`; the field's description is its help, and
    its value is checked by the model. Option groups and the fields the face sets itself are left out. `shown`
    names the values a field's help lists where a registry, not its type, holds them (the backends; the verb refuses
    any other with its one-line error)."""
    for name, field in model.model_fields.items():
        if (only is not None and name not in only) or name in skip or name in FACE_SET or option_group(field):
            continue
        help_text = (field.description or "").replace("%", "%%")
        kind = _kind(field.annotation)
        if field.is_required():
            metavar = next((m.metavar for m in field.metadata if isinstance(m, Positional)), None)
            parser.add_argument(name, type=_convert(kind), metavar=metavar, help=help_text)
            continue
        flag = cli_flag(name, field)
        names = [flag.name, *([flag.short] if flag.short else [])]
        if kind is bool:
            negates = field.default is True
            parser.add_argument(*names, dest=name, action="store_false" if negates else "store_true", default=None,
                                help=f"turn off: {help_text}" if negates else help_text)
            continue
        default = f" (default {_shown(field.default)})" if field.default not in (None, ()) else ""
        listed = (shown or {}).get(name)
        parser.add_argument(*names, dest=name, type=_convert(kind), default=None, help=help_text + default,
                            action="append" if flag.repeat else "store",
                            metavar="{" + ",".join(listed) + "}" if listed else _metavar(name, kind))


def _kind(annotation: Any) -> Any:
    """`annotation` without its `| None`."""
    kinds = [k for k in get_args(annotation) if k is not type(None)] if get_origin(annotation) in UNIONS else []
    return kinds[0] if len(kinds) == 1 else annotation


def _convert(kind: Any) -> Callable[[str], Any]:
    return kind if kind in (int, float, Path) else str


def _metavar(name: str, kind: Any) -> str:
    if kind == dict[str, float]:
        return "CLASS=VALUE"
    if get_origin(kind) is Literal:
        return "{" + ",".join(map(str, get_args(kind))) + "}"
    return {int: "N", float: "SECONDS" if name.endswith("_s") else "X"}.get(kind, name.upper())


def _shown(default: Any) -> str:
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


def options_from(args: argparse.Namespace, model: type[M], **values: Any) -> M:
    """The request or option group `model` as the command line set it (unset flags keep the model's defaults),
    with `values` for the fields the face sets itself."""
    given: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        value = getattr(args, name, None)
        if value is None or name in values:
            continue
        if field.annotation == tuple[int, ...]:
            value = parse_seeds(value)  # comma-separated
        elif _kind(field.annotation) == dict[str, float]:
            value = parse_tolerances(value)  # repeated CLASS=RTOL
        given[name] = tuple(value) if isinstance(value, list) else value
    return build(model, **given, **values)


def build(model: type[M], **values: Any) -> M:
    """A request, or the UsageError naming the flag that made it invalid."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise usage_error(exc, _spelling) from exc


def _spelling(name: str) -> str:
    for group in MODELS:
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
    req = options_from(args, ProfileRequest, python=_interpreter(args), capture=capture,
                       ncu=options_from(args, NcuOptions) if counters else None, require_counters=False,
                       project=Path.cwd(), command_line=["operator-profiler", *argv])
    return _print_profile(api.profile(req, _STATUS))


def cmd_memory(args: argparse.Namespace) -> int:
    """The memory pass of a workload (or memory.json rebuilt from a run directory): the peak and who holds it."""
    req = options_from(args, MemoryRequest, python=_interpreter(args), capture=options_from(args, CaptureOptions),
                       project=Path.cwd())
    result = api.memory(req, _STATUS)
    _print(result.summary)
    if result.chart_path:
        _print(f"chart: {result.chart_path}")
    _print(f"snapshot: {result.snapshot_path} (opens in https://pytorch.org/memory_viz)")
    return 0


def cmd_map(args: argparse.Namespace) -> int:
    """Add ncu counters to a run directory captured with the nsys backend."""
    return _print_profile(api.map_run(options_from(args, MapRequest, ncu=options_from(args, NcuOptions)), _STATUS))


def cmd_assemble(args: argparse.Namespace) -> int:
    """Rebuild profile.json from the raw artifacts (no GPU needed)."""
    return _print_profile(api.assemble(options_from(args, AssembleRequest), _STATUS))


def cmd_summary(args: argparse.Namespace) -> int:
    """Print the window paragraph and top-operators table of an existing profile.json."""
    result = api.summary(options_from(args, SummaryRequest))
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
    result = api.preflight(options_from(args, PreflightRequest, python=_interpreter(args)))
    _print(result.summary)
    return 0 if result.ok else 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """Roofline, bottleneck classes, stalls, timeline health and ranked opportunities of a profile."""
    result = api.analyze(options_from(args, AnalyzeRequest, project=Path.cwd()), _STATUS)
    _print(result.summary)
    _print(f"\nanalysis: {result.analysis_path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Per-operator and per-module deltas of two profiles: comparison.json and comparison.md."""
    result = api.compare(options_from(args, CompareRequest, project=Path.cwd()))
    _print(result.summary)
    for path in (result.comparison_path, result.markdown_path):
        _print(f"wrote {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Each side in its own processes, rounds alternating; the speedups with their confidence intervals."""
    req = options_from(args, BenchRequest, python=_interpreter(args), timing=options_from(args, TimingOptions),
                       project=Path.cwd())
    result = api.bench(req, _STATUS)
    _print_outcome(result.summary, result.warnings, f"wrote {result.bench_path}")
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    """The free frontier: every recipe timed in its own process and validated; the winner of each tier."""
    req = options_from(args, RecipesRequest, python=_interpreter(args), timing=options_from(args, RecipeTiming),
                       project=Path.cwd())
    result = api.recipes(req, _STATUS)
    _print_outcome(result.summary, result.warnings,
                   f"wrote {result.recipes_path}" + (f" and {result.frontier_chart}" if result.frontier_chart else ""))
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    """The floor in one command: the tier's frontier winner as an optimized workload, validated, benched, reported."""
    req = options_from(args, OptimizeRequest, python=_interpreter(args), timing=options_from(args, TimingOptions),
                       project=Path.cwd())
    result = api.optimize(req, _STATUS)
    _print_outcome(result.summary, result.warnings, f"wrote {len(result.files)} files into {result.out_dir}")
    return 0 if result.validation_passed else 1


def _print_outcome(summary: str, warnings: list[str], wrote: str) -> None:
    """A verb's one-paragraph summary, its warnings, then what it wrote."""
    _print(summary)
    for warning in warnings:
        _print(f"warning: {warning}")
    _print(wrote)


def cmd_validate(args: argparse.Namespace) -> int:
    """Numerical and behavioural checks of an optimized workload; exit 1 when a check fails."""
    result = api.validate(options_from(args, ValidateRequest, python=_interpreter(args), project=Path.cwd()), _STATUS)
    _print_validation(result)
    _print(f"wrote {result.report_path}")
    return 0 if result.passed else 1


def cmd_report(args: argparse.Namespace) -> int:
    """Render the documents and print their paths."""
    for path in api.report(options_from(args, ReportRequest, project=Path.cwd())).files:
        _print(f"wrote {path}")
    return 0


def cmd_loop_status(args: argparse.Namespace) -> int:
    """Which stage of the optimization loop on a workload is next, and why (exit 0 whatever the state)."""
    result = api.loop_status(options_from(args, LoopStatusRequest))
    _print(result.model_dump_json(indent=1) if args.json else format_loop_status(result))
    return 0


# --------------------------------------------------------------------------------------------- the parser


class _Parser(argparse.ArgumentParser):
    """argparse, whose errors are one line with a remedy like every other error of the tool (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"operator-profiler: error: {message} — see `{self.prog} --help`\n")


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    add_options(p, ProfileRequest, skip=("require_counters", "top", "memory"),
                shown={"backend": backend_choices()})
    _add_python(p)
    add_options(p, CaptureOptions)
    add_options(p, ProfileRequest, only=("memory",))
    _add_output_options(p)


def _add_python(p: argparse.ArgumentParser) -> None:
    field = Interpreter.model_fields["python"]
    p.add_argument(cli_flag("python", field).name, default=sys.executable,
                   help=f"{field.description} (default: this one, %(default)s)")


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="show no progress, only the result")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    _add_quiet(p)
    p.add_argument("--verbose", "-v", action="store_true",
                   help="also show the workload's and the profilers' own output (each pass's output.log keeps it)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand: each argument made from its request model's field."""
    parser = _Parser(
        prog="operator-profiler",
        description="Attribute every CUDA kernel of a PyTorch workload to the operator and module that launched it.",
    )
    parser.add_argument("--version", action="version", version=f"operator-profiler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("profile", help="capture a workload's measured window and write profile.json (on a GPU, "
                       "also timed with no profiler)", description=PROFILE_DESCRIPTION)
    _add_capture_options(p)
    p = sub.add_parser("run", help="profile with nsys, time the window with no profiler, replay with ncu for counters",
                       description=PROFILE_DESCRIPTION + RUN_DESCRIPTION)
    _add_capture_options(p)
    add_options(p, NcuOptions)
    for action in p._actions:
        if action.dest == "backend":  # run always uses nsys
            action.help = argparse.SUPPRESS
    p = sub.add_parser(
        "memory", help="where every byte at the window's peak comes from: memory.json (CUDA allocator history)",
        description="Run the workload's window once more with the CUDA caching allocator's history recorded (Python "
        "stacks), in the same harness, compile mode and run mode, and attribute every block live at the peak to its "
        "operator, module, phase (forward, backward, optimizer), line and category (parameter, gradient, optimizer "
        "state, activation, temporary, workspace, input/output, retained). Writes memory.json, memory_timeline.png "
        "and the allocator's snapshot into the run directory. Given a run directory instead, rebuilds memory.json "
        "from its files (no GPU). Needs an NVIDIA GPU to capture.")
    add_options(p, MemoryRequest, skip=("top",))
    _add_python(p)
    add_options(p, CaptureOptions, WINDOW_OPTIONS)
    add_options(p, MemoryRequest, only=("top",))
    _add_output_options(p)
    p = sub.add_parser("map", help="replay a captured run's kernels under ncu and rebuild profile.json")
    add_options(p, MapRequest, skip=("top",))
    add_options(p, NcuOptions)
    _add_output_options(p)
    p = sub.add_parser("assemble", help="rebuild RUN_DIR/profile.json from its raw artifacts (no GPU needed)")
    add_options(p, AssembleRequest, skip=("top",))
    _add_quiet(p)
    p = sub.add_parser("analyze", help="diagnose a profile: roofline, bottlenecks, stalls, ranked opportunities")
    add_options(p, AnalyzeRequest)
    _add_quiet(p)
    p = sub.add_parser("compare", help="per-operator deltas of two profile.json (comparison.json + .md)")
    add_options(p, CompareRequest, skip=("top",))
    _add_quiet(p)
    p = sub.add_parser(
        "bench", help="time two workloads, each in its own processes; speedups with 95%% confidence intervals",
        description="Time BASELINE (as written, a free recipe, or the winner of a tier of the free frontier) against "
        "OPTIMIZED: each side in its own fresh processes, never two timed at once. A round runs one process of "
        "each side in turn (A B, B A, ...); with --interleave, a round starts one process of each side, they compile "
        "side by side, then time their blocks in turns (A B B A ...) and the interval pairs each block with the "
        "other side's next to it. Each process reports latency (each call alone, synchronised) and back-to-back "
        "time per call; the headline is latency unless --throughput.")
    _add_python(p)
    add_options(p, BenchRequest)
    add_options(p, TimingOptions)
    _add_output_options(p)
    p = sub.add_parser(
        "recipes", help="measure the free frontier: every free recipe timed in its own process and validated",
        description="Run WORKLOAD under every recipe a user can paste in a few lines (torch.compile modes, TF32, "
        "bf16/fp16 autocast, the whole model cast to bf16/fp16, channels_last or channels_last_3d, cuDNN's "
        "autotuner), each in its own "
        "process, validated against eager as written (TF32 off) over several seeds and sorted into the exact, "
        "reduced or fp8 tier (a model written in bf16/fp16: each tolerance at least twice its own distance from "
        "fp32); "
        "writes recipes.json and frontier.png and prints the winner of each tier with its lines of code.")
    _add_python(p)
    add_options(p, RecipesRequest)
    add_options(p, RecipeTiming)
    _add_output_options(p)
    p = sub.add_parser(
        "optimize", help="the floor in one command: the tier's free-frontier winner as an optimized workload, proven",
        description="Profile WORKLOAD, measure its free frontier (the tier's close race run off: the recipes within "
        "1.15x of its winner timed in two more processes each), write the tier's winner as <name>_optimized.py "
        "(plain code in optimize(model)), bench it against eager and against the winner (each side in its own "
        "processes), validate it, profile the optimized workload, compare and render report.md and "
        "OPTIMIZED_WORKLOAD.md: every file in the output folder, none beside the workload. Exit 1 when validation "
        "fails.")
    _add_python(p)
    add_options(p, OptimizeRequest)
    add_options(p, TimingOptions)
    _add_output_options(p)
    p = sub.add_parser("validate", help="check an optimized workload against its baseline (validation_report.json)")
    _add_python(p)
    add_options(p, ValidateRequest)
    _add_output_options(p)
    p = sub.add_parser("report", help="render report.md and OPTIMIZED_WORKLOAD.md (or, with --plan, the proposal)")
    add_options(p, ReportRequest)
    _add_quiet(p)
    p = sub.add_parser("preflight", help="check GPU, driver, torch/CUDA, nsys, ncu and counter permission")
    _add_python(p)
    add_options(p, PreflightRequest)
    p = sub.add_parser(
        "loop-status", help="which stage of the /optimize loop on a workload is next, and why",
        description="Judge every stage of the optimization loop on WORKLOAD from the checkpoint files in its folder: "
        "done, missing, stale (an input changed since: input hashes from loop_state.json where a tool recorded the "
        "file, else modification times) or failed (validation_report.json did not pass). Prints the next stage, the "
        "--from= value to resume with, and which files are reused and which written again. Exit status 0 whatever "
        "the loop's state; 1 when WORKLOAD is missing or loop_state.json is unreadable.")
    add_options(p, LoopStatusRequest)
    p.add_argument("--json", action="store_true", help="print the result as JSON (the loop_status tool's output)")
    p = sub.add_parser("summary", help="print the top-operators table of a profile.json")
    add_options(p, SummaryRequest)
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
