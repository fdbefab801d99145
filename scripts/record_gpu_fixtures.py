"""Record real run directories on a GPU machine for the CPU test suite (tests/fixtures/).

For each workload and compile mode it runs the product's own capture passes (torch.profiler, nsys, ncu)
on the example at `OPERATOR_PROFILER_EXAMPLE_SCALE=small`, then packs the run directory as
`<out>/<gpu>_<workload>_<mode>.tar.xz` (nsys's .nsys-rep is dropped: its SQLite export is kept).

    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mcp_server.pipeline.capture import CaptureRequest  # noqa: E402
from mcp_server.pipeline.passes import NcuOptions, ncu_pass, nsys_pass, torch_pass  # noqa: E402


def record(workload: str, mode: str, scale: str, passes: list[str], root: Path, train: bool) -> dict[str, float]:
    """Run the passes for one workload/mode into root/<name>; return wall seconds per pass."""
    os.environ["OPERATOR_PROFILER_EXAMPLE_SCALE"] = scale
    name = f"{workload}_{mode}" + ("_train" if train else "") + ("" if scale == "small" else f"_{scale}")
    req = CaptureRequest(
        workload=REPO / "examples" / workload / f"{workload}.py", run_dir=root / name,
        compile_mode=mode, train_step=train, timeout_s=540,
    )
    times: dict[str, float] = {}
    for pass_name in passes:
        t0 = time.monotonic()
        try:
            if pass_name == "torch":
                torch_pass(req)
            elif pass_name == "nsys":
                nsys_pass(req)
            elif pass_name == "ncu":
                ncu_pass(req, NcuOptions())
        except Exception as exc:  # noqa: BLE001 - a recording script reports and goes on
            print(f"!! {name} {pass_name}: {exc}", flush=True)
        times[pass_name] = time.monotonic() - t0
        print(f"{name:32s} {pass_name:6s} {times[pass_name]:7.1f} s", flush=True)
    return times


def pack(run_dir: Path, out: Path, gpu: str) -> Path:
    """tar.xz the run directory without the .nsys-rep (the SQLite export carries its content)."""
    for rep in run_dir.glob("*/report.nsys-rep"):
        rep.unlink()
    target = out / f"{gpu}_{run_dir.name}.tar.xz"
    subprocess.run(["tar", "-cJf", str(target), "-C", str(run_dir.parent), run_dir.name], check=True,
                   env={**os.environ, "XZ_OPT": "-9"})
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--work", type=Path, default=Path("/tmp/op_fixtures"))
    parser.add_argument("--workloads", default="conv_block,gpt2")
    parser.add_argument("--modes", default="eager,inductor")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            rows.append((workload, mode, record(workload, mode, "small", ["torch", "nsys", "ncu"], args.work, False)))
    rows.append(("conv_block", "eager-train", record("conv_block", "eager", "small", ["torch"], args.work, True)))
    rows.append(("gpt2", "eager-full", record("gpt2", "eager", "full", ["torch"], args.work, False)))
    for run_dir in sorted(p for p in args.work.iterdir() if p.is_dir()):
        packed = pack(run_dir, args.out, args.gpu)
        print(f"packed {packed.name}: {packed.stat().st_size / 1024:.0f} KiB")
    print("\nworkload      mode          " + "  ".join(f"{p:>7s}" for p in ("torch", "nsys", "ncu")))
    for workload, mode, times in rows:
        cells = "  ".join(f"{times.get(p, float('nan')):6.1f}s" for p in ("torch", "nsys", "ncu"))
        print(f"{workload:13s} {mode:13s} {cells}")


if __name__ == "__main__":
    main()
