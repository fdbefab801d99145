"""The `report` subcommand's arguments and its handler, for mcp_server/cli.py to register."""

from __future__ import annotations

import argparse
from pathlib import Path

from mcp_server.errors import UsageError
from mcp_server.render.render import render_plan, render_report


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """PROFILE plus the optional files of the loop; --plan renders the proposal documents instead."""
    p.add_argument("profile", type=Path, help="the baseline profile.json")
    p.add_argument("--optimized-profile", type=Path, help="profile.json of the optimized workload")
    p.add_argument("--analysis", type=Path, help="analysis.json (residual opportunities)")
    p.add_argument("--comparison", type=Path, help="comparison.json of the two profiles")
    p.add_argument("--bench", type=Path, help="bench.json: the only source of the stated speedup")
    p.add_argument("--validation", type=Path, help="validation_report.json")
    p.add_argument("--optimizations", type=Path, help="optimizations.json (what was planned, applied or not)")
    p.add_argument("--plan", action="store_true",
                   help="render proposal.md and implementation.md from PROFILE and --optimizations instead")
    p.add_argument("--output", "-o", type=Path, help="folder for the documents (default: beside PROFILE)")


def cmd_report(args: argparse.Namespace) -> int:
    """Render the documents and print their paths."""
    out = args.output or args.profile.parent
    if args.plan:
        if args.optimizations is None:
            raise UsageError("--plan needs --optimizations", "pass the optimizations.json the strategist wrote")
        paths = render_plan(args.profile, args.optimizations, out, analysis=args.analysis)
    else:
        paths = render_report(
            args.profile, out, optimized_profile=args.optimized_profile, analysis=args.analysis,
            comparison=args.comparison, bench=args.bench, validation=args.validation, optimizations=args.optimizations,
        )
    for path in paths:
        print(f"wrote {path}")
    return 0
