"""Record real run directories on a GPU machine for the CPU test suite (tests/fixtures/).

For each workload and compile mode it runs the product's own capture (`operator-profiler run`: nsys and
ncu passes, and a torch.profiler pass in a sibling run directory) on the example at
`OPERATOR_PROFILER_EXAMPLE_SCALE=small`, then packs both run directories as
`<out>/<gpu>_<workload>_<mode>.tar.xz` (nsys's .nsys-rep is dropped: its SQLite export carries its content).

    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads mlp_activations --modes inductor \
        --no-extras   # the run tests/test_ncu_dedupe_fixture.py replays
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads two_threads --modes eager \
        --no-extras --no-torch   # tests/scripts/two_threads.py: launches from two host threads
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads conv_block --modes eager \
        --no-extras --no-torch --max-kernels 5   # an ncu pass stopped by --max-kernels
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads encoder_train_step --train \
        --no-extras --no-ncu   # scripts/gpu_workloads: a training step, eager and inductor
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads graph_breaks --modes inductor \
        --no-extras --no-ncu   # a forward that compiles to three graphs
    python scripts/record_gpu_fixtures.py --out "$OUT" --gpu h100 --workloads mlp_activations --modes eager \
        --no-extras --no-torch   # the default metric set as it stands (tests/test_ncu_busiest_of.py)
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

from mcp_server import api  # noqa: E402
from mcp_server.backends.registry import REGISTRY  # noqa: E402
from mcp_server.schema.io import load_profile  # noqa: E402
from mcp_server.schema.requests import CaptureOptions, Interpreter, NcuOptions, ProfileRequest  # noqa: E402


def workload_path(workload: str) -> Path:
    """An example's file, a GPU check's (scripts/gpu_workloads/<name>.py) or a test workload's
    (tests/scripts/<name>.py)."""
    for path in (REPO / "examples" / workload / f"{workload}.py",
                 REPO / "scripts" / "gpu_workloads" / f"{workload}.py"):
        if path.is_file():
            return path
    return REPO / "tests" / "scripts" / f"{workload}.py"


def record(workload: str, mode: str, scale: str, backends: list[str], root: Path, train: bool,
           max_kernels: int | None = None, counters: bool = True) -> dict[str, float]:
    """Capture one workload/mode with each backend into root/<name>[_torch]; return wall seconds per backend."""
    os.environ["OPERATOR_PROFILER_EXAMPLE_SCALE"] = scale
    name = (f"{workload}_{mode}" + ("_train" if train else "") + ("" if scale == "small" else f"_{scale}")
            + (f"_max{max_kernels}" if max_kernels else ""))
    times: dict[str, float] = {}
    for backend in backends:
        run_dir = root / name / (name if backend == "nsys" else f"{name}_torch")
        req = ProfileRequest(
            workload=workload_path(workload), python=Interpreter(python=sys.executable),
            capture=CaptureOptions(compile_mode=mode, train_step=train, timeout_s=540), backend=backend,
            ncu=NcuOptions(max_kernels=max_kernels) if REGISTRY[backend].counters and counters else None,
            output=run_dir, project=REPO,
            command_line=["scripts/record_gpu_fixtures.py", workload, mode, backend],
        )
        t0 = time.monotonic()
        try:
            profile = load_profile(Path(api.profile(req).profile_path))
            print(f"   {len(profile.operators)} operators, {profile.window.kernel_count} kernels, "
                  f"attributed {profile.window.attributed_kernel_time_pct}%, warnings {profile.warnings}", flush=True)
            (run_dir / "profile.json").unlink()
        except Exception as exc:  # noqa: BLE001 - a recording script reports and goes on
            print(f"!! {name} {backend}: {exc}", flush=True)
        times[backend] = time.monotonic() - t0
        print(f"{name:32s} {backend:6s} {times[backend]:7.1f} s", flush=True)
    return times


def pack(folder: Path, out: Path, gpu: str) -> Path:
    """tar.xz the run directories without the .nsys-rep (the SQLite export carries its content)."""
    for rep in folder.glob("*/*/report.nsys-rep"):
        rep.unlink()
    target = out / f"{gpu}_{folder.name}.tar.xz"
    subprocess.run(["tar", "-cJf", str(target), "-C", str(folder), *sorted(p.name for p in folder.iterdir())],
                   check=True, env={**os.environ, "XZ_OPT": "-9"})
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--work", type=Path, default=Path("/tmp/op_fixtures"))
    parser.add_argument("--workloads", default="conv_block,gpt2")
    parser.add_argument("--modes", default="eager,inductor")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip the torch-only recordings (conv_block train step, full-size gpt2)")
    parser.add_argument("--no-torch", action="store_true", help="record the nsys+ncu run directories only")
    parser.add_argument("--max-kernels", type=int, help="stop ncu after this many replayed kernels (name: _max<N>)")
    parser.add_argument("--scale", default="small", choices=("small", "full"), help="the examples' sizes")
    parser.add_argument("--train", action="store_true", help="capture train_step (name: _train)")
    parser.add_argument("--no-ncu", action="store_true", help="nsys without an ncu pass (attribution fixtures)")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            backends = ["nsys"] if args.no_torch else ["nsys", "torch"]
            rows.append((workload, mode, record(workload, mode, args.scale, backends, args.work, args.train,
                                                args.max_kernels, not args.no_ncu)))
    if not args.no_extras:
        rows.append(("conv_block", "eager-train", record("conv_block", "eager", "small", ["torch"], args.work, True)))
        rows.append(("gpt2", "eager-full", record("gpt2", "eager", "full", ["torch"], args.work, False)))
    for folder in sorted(p for p in args.work.iterdir() if p.is_dir()):
        packed = pack(folder, args.out, args.gpu)
        print(f"packed {packed.name}: {packed.stat().st_size / 1024:.0f} KiB")
    print("\nworkload      mode          nsys+ncu    torch")
    for workload, mode, times in rows:
        cells = "  ".join(f"{times.get(p, float('nan')):7.1f}s" for p in ("nsys", "torch"))
        print(f"{workload:13s} {mode:13s} {cells}")


if __name__ == "__main__":
    main()
