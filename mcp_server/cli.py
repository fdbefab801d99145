"""operator-profiler: the command-line front door to the engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mcp_server import __version__
from mcp_server.errors import ProfilerError, UsageError
from mcp_server.pipeline.capture import COMPILE_MODES, CaptureRequest
from mcp_server.pipeline.passes import NcuOptions
from mcp_server.pipeline.profiling import BACKENDS, build_profile, capture, choose_backend, map_counters
from mcp_server.pipeline.rundir import default_run_dir, read_manifest
from mcp_server.preflight import format_report as format_preflight
from mcp_server.preflight import preflight
from mcp_server.schema.io import load_profile
from mcp_server.summary import format_top_operators, format_window


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def _stage(line: str) -> None:
    print(f"[operator-profiler] {line}", file=sys.stderr, flush=True)


def _positive(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return number


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", type=Path, help="Python file with get_model_and_input() (or an NvtxCapture window)")
    p.add_argument("--output", "-o", type=Path, help="run directory (default: ./op_runs/<workload>-<time>)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the workload (default: this one, %(default)s)")
    p.add_argument("--compile-mode", default="eager",
                   help=f"{' | '.join(COMPILE_MODES)} (cudagraphs = torch.compile mode='reduce-overhead')")
    p.add_argument("--warmup-iters", type=_positive, default=3, help="iterations before the window (default 3)")
    p.add_argument("--iters", type=_positive, default=1, help="iterations inside the measured window (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed for every RNG (default 0)")
    p.add_argument("--train-step", action="store_true", help="profile the workload's train_step(model, inputs)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per capture pass (default 600)")
    p.add_argument("--quiet", "-q", action="store_true", help="do not echo the workload's output")


def _add_ncu_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-dedupe", action="store_true",
                   help="replay every launch (default: each unique name+grid+block once, counters propagated)")
    p.add_argument("--kernel-regex", help="replay only kernels whose name matches")
    p.add_argument("--launch-skip", type=_positive, help="skip this many matching launches first")
    p.add_argument("--launch-count", type=_positive, help="replay at most this many launches")
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
        launch_count=args.launch_count, sections=args.section, metric_set=args.metric_set,
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
    progress = (lambda _: None) if args.quiet else _progress
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
