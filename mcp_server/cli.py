"""operator-profiler: the command-line front door to the engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcp_server import __version__
from mcp_server.bench import bench, load_bench_result
from mcp_server.bench import summary_line as bench_line
from mcp_server.compare import compare_paths
from mcp_server.errors import ProfilerError, UsageError
from mcp_server.pipeline.capture import COMPILE_MODES, CaptureRequest
from mcp_server.pipeline.passes import NcuOptions
from mcp_server.pipeline.profiling import BACKENDS, build_profile, capture, choose_backend, map_counters
from mcp_server.pipeline.rundir import default_run_dir, read_manifest
from mcp_server.preflight import format_report as format_preflight
from mcp_server.preflight import preflight
from mcp_server.render.arguments import add_report_arguments, cmd_report
from mcp_server.render.comparison import summary_line as compare_line
from mcp_server.render.comparison import write_comparison
from mcp_server.schema.io import load_profile
from mcp_server.summary import format_top_operators, format_window
from mcp_server.validate import parse_tolerances, render_checks, validate


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _silent(_: str) -> None:
    """Progress sink for --quiet."""


def _stage(line: str) -> None:
    print(f"[operator-profiler] {line}", file=sys.stderr, flush=True)


def _positive(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return number


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", type=Path, help="Python file with get_model_and_input() (or an NvtxCapture window)")
    p.add_argument("--output", "-o", type=Path, help="run directory (default: ./op_runs/<workload>-<time>)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the workload (default: this one, %(default)s)")
    p.add_argument("--compile-mode", default="eager",
                   help=f"{' | '.join(COMPILE_MODES)} (cudagraphs = torch.compile mode='reduce-overhead'; optimized = "
                   "the workload's own optimize(model), see docs/optimized-workload-contract.md)")
    p.add_argument("--warmup-iters", type=_positive, default=3, help="iterations before the window (default 3)")
    p.add_argument("--iters", type=_positive, default=1, help="iterations inside the measured window (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed for every RNG (default 0)")
    p.add_argument("--train-step", action="store_true", help="profile the workload's train_step(model, inputs)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per capture pass (default 600); an ncu pass stopped at this limit keeps the "
                        "kernels it replayed so far")
    p.add_argument("--quiet", "-q", action="store_true", help="do not echo the workload's output")


def _add_ncu_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-dedupe", action="store_true",
                   help="replay every launch (default: each unique mangled name+grid+block+shared memory once, "
                        "counters propagated)")
    p.add_argument("--kernel-regex", help="replay only kernels whose mangled name matches (a Triton kernel's mangled "
                                          "name is its name; a C++ kernel's contains its identifiers)")
    p.add_argument("--launch-skip", type=_positive, help="skip this many matching launches first")
    p.add_argument("--launch-count", type=_positive, help="replay at most this many launches")
    p.add_argument("--max-kernels", type=_at_least_one,
                   help="stop ncu once it replayed this many kernels (the first distinct ones in launch order); "
                        "later launches of their configurations still get their counters")
    p.add_argument("--set", dest="metric_set", help="also collect an ncu section set (e.g. full) for deep dives")
    p.add_argument("--section", action="append", default=[], help="also collect this ncu section (repeatable)")
    p.add_argument("--ncu-sudo", action="store_true", help="run ncu through `sudo -n` (never prompts)")


def _request(args: argparse.Namespace, run_dir: Path) -> CaptureRequest:
    if args.compile_mode not in COMPILE_MODES:
        raise UsageError(f"unknown --compile-mode {args.compile_mode!r}", f"choose one of {', '.join(COMPILE_MODES)}")
    return CaptureRequest(
        workload=args.workload, run_dir=run_dir, python=args.python, compile_mode=args.compile_mode,
        warmup_iters=args.warmup_iters, iters=args.iters, seed=args.seed, train_step=args.train_step,
        timeout_s=args.timeout,
    )


def _ncu_options(args: argparse.Namespace) -> NcuOptions:
    return NcuOptions(
        dedupe=not args.no_dedupe, kernel_regex=args.kernel_regex, launch_skip=args.launch_skip,
        launch_count=args.launch_count, max_kernels=args.max_kernels, sections=args.section, metric_set=args.metric_set,
        cuda_graphs=args.compile_mode == "cudagraphs", sudo=args.ncu_sudo,
    )


def _report(result_run_dir: Path, top: int = 10) -> int:
    result = build_profile(result_run_dir, _stage)
    profile = result.profile
    print(format_window(profile))
    for warning in profile.warnings:
        print(f"warning: {warning}")
    print()
    print(format_top_operators(profile))
    print(f"\nprofile: {result.profile_path}")
    return 0


def cmd_profile(args: argparse.Namespace, argv: list[str], with_ncu: bool = False) -> int:
    """capture -> run directory -> profile.json, then the top-operators table."""
    run_dir = args.output or default_run_dir(args.workload)
    req = _request(args, run_dir)
    req.check()
    backend = choose_backend(args.backend)
    _stage(f"backend: {'nsys + ncu' if backend == 'nsys' else 'torch.profiler'}"
           + (" (auto)" if args.backend == "auto" else "") + f"; run directory: {run_dir}")
    if with_ncu and backend == "torch":
        _stage("no hardware counters: nsys and ncu need an NVIDIA GPU with Nsight Systems and Compute here "
               "(see `operator-profiler preflight`); profiling with torch.profiler instead")
    progress = _silent if args.quiet else _progress
    capture(req, backend, ["operator-profiler", *argv], progress,
            ncu=_ncu_options(args) if (with_ncu and backend == "nsys") else None)
    return _report(req.run_dir)


def cmd_map(args: argparse.Namespace) -> int:
    """Add ncu counters to a run directory captured with the nsys backend."""
    manifest = read_manifest(args.run_dir)
    req = CaptureRequest(
        workload=Path(manifest.workload), run_dir=args.run_dir.resolve(), python=manifest.python,
        compile_mode=manifest.compile_mode, warmup_iters=manifest.warmup_iters, iters=manifest.iters,
        seed=manifest.seed, train_step=manifest.run_mode == "train_step", timeout_s=args.timeout,
    )
    if manifest.backend != "nsys+ncu":
        raise UsageError(f"{args.run_dir} was captured with backend {manifest.backend}",
                         "map needs a run captured with --backend nsys")
    args.compile_mode = manifest.compile_mode
    map_counters(req, _ncu_options(args), _progress)
    return _report(req.run_dir)


def cmd_assemble(args: argparse.Namespace) -> int:
    """Rebuild profile.json from the raw artifacts (no GPU needed)."""
    return _report(args.run_dir)


def cmd_summary(args: argparse.Namespace) -> int:
    """Print the window paragraph and top-operators table of an existing profile.json."""
    profile = load_profile(args.profile)
    print(format_window(profile))
    print()
    print(format_top_operators(profile, args.top))
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """Check GPU, driver, torch/CUDA, nsys, ncu and counter permission; exit 1 if any check failed."""
    report = preflight(args.python, quick=args.quick)
    print(format_preflight(report))
    return 0 if report.ok else 1


def cmd_analyze(args: argparse.Namespace) -> int:
    """Roofline, bottleneck classes, stalls, timeline health and ranked opportunities of a profile."""
    from mcp_server.analysis import analyze_profile, format_summary

    profile = load_profile(args.profile)
    out = args.output or args.profile.parent / "analysis"
    analysis = analyze_profile(profile, out, profile_path=args.profile.resolve(), measure=not args.no_microbench)
    print(format_summary(analysis))
    print(f"\nanalysis: {out / 'analysis.json'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Per-operator and per-module deltas of two profiles: comparison.json and comparison.md."""
    comparison = compare_paths(args.baseline, args.optimized, args.allow_mismatch)
    paths = write_comparison(comparison, args.output or args.optimized.parent)
    print(compare_line(comparison))
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Interleaved timing of two workloads; the speedup with its confidence interval."""
    out = args.output or default_run_dir(args.optimized, suffix="bench")
    result = bench(
        args.baseline, args.optimized, python=args.python, warmup=args.warmup, reps=args.reps, rounds=args.rounds,
        input_sets=args.input_sets, seed=args.seed, baseline_mode=args.baseline_mode, out_dir=out,
        timeout_s=args.timeout, progress=_silent if args.quiet else _progress,
    )
    print(bench_line(result))
    print(f"wrote {out / 'bench.json'}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Numerical and behavioural checks of an optimized workload; exit 1 when a check fails."""
    speedup = args.speedup
    if args.bench is not None:
        speedup = load_bench_result(args.bench).speedup.point
    out = args.output or args.optimized.parent
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    report = validate(
        args.baseline, args.optimized, python=args.python, seeds=seeds, rtol=args.rtol, atol=args.atol,
        tolerances=parse_tolerances(args.tolerance or []), run_tests=not args.no_tests, speedup=speedup,
        max_plausible_speedup=args.max_plausible_speedup, out_dir=out, timeout_s=args.timeout,
        progress=_silent if args.quiet else _progress,
    )
    print(render_checks(report))
    print(f"wrote {out / 'validation_report.json'}")
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="operator-profiler",
        description="Attribute every CUDA kernel of a PyTorch workload to the operator and module that launched it.",
    )
    parser.add_argument("--version", action="version", version=f"operator-profiler {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("profile", help="capture a workload's measured window and write profile.json")
    _add_capture_options(p)
    p.add_argument("--backend", default="auto",
                   help=f"{' | '.join(BACKENDS)}: auto uses nsys when an NVIDIA GPU, nsys and ncu are present, "
                   "else torch.profiler")
    p = sub.add_parser("run", help="profile with nsys, then replay with ncu for counters (profile + map)")
    _add_capture_options(p)
    _add_ncu_options(p)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    p = sub.add_parser("map", help="replay a captured run's kernels under ncu and rebuild profile.json")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the ncu pass (default 600)")
    _add_ncu_options(p)
    p = sub.add_parser("assemble", help="rebuild RUN_DIR/profile.json from its raw artifacts (no GPU needed)")
    p.add_argument("run_dir", type=Path)
    p = sub.add_parser("analyze", help="diagnose a profile: roofline, bottlenecks, stalls, ranked opportunities")
    p.add_argument("profile", type=Path)
    p.add_argument("--output", "-o", type=Path, help="folder for analysis.json, charts, trace (default: beside it)")
    p.add_argument("--no-microbench", action="store_true",
                   help="for a GPU missing from knowledge/devices.yaml, do not measure its peaks")
    p = sub.add_parser("compare", help="per-operator deltas of two profile.json (comparison.json + .md)")
    p.add_argument("baseline", type=Path)
    p.add_argument("optimized", type=Path)
    p.add_argument("--output", "-o", type=Path, help="folder for comparison.json/.md (default: beside OPTIMIZED)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare profiles of different devices or input shapes anyway")
    p = sub.add_parser("bench", help="time two workloads interleaved; speedup with a 95%% confidence interval")
    p.add_argument("baseline", type=Path)
    p.add_argument("optimized", type=Path)
    p.add_argument("--python", default=sys.executable, help="interpreter that runs both (%(default)s)")
    p.add_argument("--warmup", type=_positive, default=5, help="warm-up calls per side (default 5)")
    p.add_argument("--reps", type=_positive, default=20, help="timed calls per side per round (default 20)")
    p.add_argument("--rounds", type=_positive, default=6, help="interleaved rounds (default 6)")
    p.add_argument("--input-sets", type=_positive, default=4, help="input sets rotated between calls (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline-mode", choices=("eager", "inductor"), default="eager",
                   help="run the baseline eagerly or under torch.compile (default eager)")
    p.add_argument("--output", "-o", type=Path, help="folder for bench.json (default ./op_runs/<name>-bench-<time>)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--quiet", "-q", action="store_true")
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
    p.add_argument("--output", "-o", type=Path, help="folder for validation_report.json (default: beside OPTIMIZED)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--quiet", "-q", action="store_true")
    p = sub.add_parser("report", help="render report.md and OPTIMIZED_WORKLOAD.md (or, with --plan, the proposal)")
    add_report_arguments(p)
    p = sub.add_parser("preflight", help="check GPU, driver, torch/CUDA, nsys, ncu and counter permission")
    p.add_argument("--python", default=sys.executable, help="interpreter that will run workloads (%(default)s)")
    p.add_argument("--quick", action="store_true", help="skip starting that interpreter and the tools (seconds)")
    p = sub.add_parser("summary", help="print the top-operators table of a profile.json")
    p.add_argument("profile", type=Path)
    p.add_argument("--top", type=_positive, default=10, help="how many operators (default 10)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors with a remedy, exit 1; 130 on Ctrl-C."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "profile":
            return cmd_profile(args, argv)
        if args.command == "run":
            return cmd_profile(args, argv, with_ncu=True)
        if args.command == "map":
            return cmd_map(args)
        if args.command == "assemble":
            return cmd_assemble(args)
        if args.command == "analyze":
            return cmd_analyze(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "preflight":
            return cmd_preflight(args)
        if args.command == "summary":
            return cmd_summary(args)
    except ProfilerError as exc:
        print(f"operator-profiler: error: {exc.one_line()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("operator-profiler: interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
