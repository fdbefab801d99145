"""Drive the optimization loop through the MCP server alone, as an agent would, over stdio.

    python scripts/mcp_drive.py WORKDIR [--workload examples/conv_block/conv_block.py]

Starts `python -m mcp_server` in WORKDIR, then calls: preflight -> profile (counters on the GPU) -> analyze
-> top_operators -> operator_detail -> kernel_detail -> profile of the optimized workload -> compare ->
validate -> bench. Prints one line per tool with the figures it returned, and exits 1 when a tool failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[1]


async def drive(workdir: Path, workload: Path, optimized: Path) -> int:
    """Call the tools in loop order; return the number of failed calls."""
    env = {**os.environ, "OPERATOR_PROFILER_PYTHON": sys.executable}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server"], cwd=str(workdir), env=env)
    failures = 0
    async with Client(params) as client:

        async def call(name: str, **arguments: Any) -> dict[str, Any]:
            nonlocal failures
            t0 = time.monotonic()
            result = await client.call_tool(name, arguments)
            wall = time.monotonic() - t0
            if result.is_error:
                failures += 1
                print(f"{name:16s} {wall:6.1f} s  ERROR {result.content[0].text}", flush=True)
                return {}
            print(f"{name:16s} {wall:6.1f} s  ok", flush=True)
            return result.structured_content or {}

        pre = await call("preflight", quick=False)
        checks = "; ".join(f"{c['name']}={c['ok']}" for c in pre.get("checks", []))
        print(f"    backend {pre.get('backend')}: {checks}")
        gpu = pre.get("backend") == "nsys"
        base = await call("profile", workload=str(workload), counters=gpu, output="mcp_baseline")
        window = base.get("window", {})
        print(f"    {window.get('kernel_count')} kernels, attributed {window.get('attributed_kernel_time_pct')} %, "
              f"with counters {window.get('kernels_with_counters')}; torch {base.get('torch_version')}")
        analysis = await call("analyze", profile=base.get("profile_path", "mcp_baseline"))
        print(f"    bottleneck: {json.dumps(analysis.get('diagnosis', {}))[:300]}")
        top = await call("top_operators", profile="mcp_baseline", limit=3)
        first = top.get("operators", [{}])[0]
        print(f"    top: {first.get('operator_name')} {first.get('gpu_time_ns')} ns")
        op_id = (first.get("operator_ids") or [None])[0]
        detail = await call("operator_detail", profile="mcp_baseline", operator_id=op_id) if op_id else {}
        if gpu:
            kernel_id = (detail.get("kernels") or [{}])[0].get("kernel_id", 0)
            kernel = await call("kernel_detail", profile="mcp_baseline", kernel_id=kernel_id)
            print(f"    kernel {kernel_id}: {str(kernel.get('kernel', {}).get('kernel_name', ''))[:60]}, "
                  f"{len(kernel.get('kernel', {}).get('metrics', {}))} metrics")
        opt = await call("profile", workload=str(optimized), counters=gpu, compile_mode="optimized",
                         output="mcp_optimized")
        comparison = await call("compare", baseline=base.get("profile_path", ""), optimized=opt.get("profile_path", ""),
                                output="mcp_compare")
        print(f"    {comparison.get('summary', '')}")
        validation = await call("validate", baseline=str(workload), optimized=str(optimized), output="mcp_validate")
        print(f"    validation passed: {validation.get('passed')}")
        bench = await call("bench", baseline=str(workload), optimized=str(optimized), reps=10, rounds=4,
                           output="mcp_bench")
        print(f"    {bench.get('summary', '')}")
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--workload", type=Path, default=REPO / "examples" / "conv_block" / "conv_block.py")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    optimized = args.workload.with_name(f"{args.workload.stem}_optimized.py")
    sys.exit(1 if anyio.run(drive, args.workdir, args.workload.resolve(), optimized.resolve()) else 0)


if __name__ == "__main__":
    main()
