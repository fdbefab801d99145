"""Where ncu's replay time goes: the window's wall time per replayed kernel under variants of the capture options.

Runs a small window (element-wise, cuDNN convolution and cuBLAS matmul launches between cudaProfilerStart and
cudaProfilerStop) under `ncu --replay-mode kernel` once per variant of the options `plugins/ncu/command.py` uses
(clock control, cache control, metric subsets) and prints, per variant, the passes ncu reported, the window's
seconds and the seconds per replayed kernel, as JSON. With `--footprint-gib`, the default variant again with that
much more device memory allocated, with `--pinned-mib` that much pinned host memory (untouched by the window's
kernels): what a large training step's allocations, or a DataLoader's pinned batches, cost each replayed kernel.
`--window resnet50-train` replays the first `--launch-count` kernels of a torchvision ResNet-50 training step (batch
32, SGD) instead: a training script's kernels. GPU machine only:

    python3 benchmarks/ncu_pass_cost.py --out pass_cost.json [--only default --footprint-gib 8 32]
    python3 benchmarks/ncu_pass_cost.py --window resnet50-train --launch-count 40 --only default duration_only
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp_server.process.child import run_child  # noqa: E402
from mcp_server.schema.io import write_json_atomic  # noqa: E402
from plugins.executables import gpu_name  # noqa: E402
from plugins.ncu.command import collected_metrics, find_ncu, replayed_passes  # noqa: E402

TIMEOUT_S = 600.0
CHILD = """
import sys, time, torch
held = [torch.ones(2**30, dtype=torch.uint8, device="cuda") for _ in range(int(sys.argv[2]))]
pinned = torch.ones(int(sys.argv[3]) * 2**20, dtype=torch.uint8).pin_memory() if int(sys.argv[3]) else None
x = torch.randn(32, 64, 56, 56, device="cuda")
w = torch.randn(64, 64, 3, 3, device="cuda")
a = torch.randn(2048, 2048, device="cuda")
for _ in range(3):
    torch.relu(x); torch.nn.functional.conv2d(x, w, padding=1); a @ a
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    torch.relu(x); torch.nn.functional.conv2d(x, w, padding=1); a @ a
torch.cuda.synchronize()
print("WINDOW_S", time.perf_counter() - t0, flush=True)
torch.cuda.cudart().cudaProfilerStop()
"""
RESNET50_TRAIN = """
import sys, time, torch, torchvision
held = [torch.ones(2**30, dtype=torch.uint8, device="cuda") for _ in range(int(sys.argv[2]))]
pinned = torch.ones(int(sys.argv[3]) * 2**20, dtype=torch.uint8).pin_memory() if int(sys.argv[3]) else None
model = torchvision.models.resnet50().cuda().train()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(32, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (32,), device="cuda")


def step():
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


for _ in range(3):
    step()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
t0 = time.perf_counter()
for _ in range(int(sys.argv[1])):
    step()
torch.cuda.synchronize()
print("WINDOW_S", time.perf_counter() - t0, flush=True)
torch.cuda.cudart().cudaProfilerStop()
"""
WINDOWS = {"small": CHILD, "resnet50-train": RESNET50_TRAIN}


def variants() -> dict[str, tuple[list[str], list[str]]]:
    """name -> (capture options, metrics)."""
    every = collected_metrics(gpu_name())  # what the capture collects on this GPU
    sass = [m for m in every if "__sass_" in m]
    base = ["--cache-control", "all", "--clock-control", "base"]
    groups = {
        "throughputs": [m for m in every if "throughput" in m],
        "stalls": [m for m in every if "_issue_stalled_" in m],
        "flop_tensor": [m for m in every if m.startswith("sm__ops_path_tensor")],
        "hit_rates": [m for m in every if "hit_rate" in m],
        "dram_bytes": [m for m in every if m.startswith("dram__bytes")],
        "launch": [m for m in every if m.startswith(("launch__", "device__"))],
    }
    table = {
        "default": (base, every),
        "clock_none": (["--cache-control", "all", "--clock-control", "none"], every),
        "cache_none": (["--cache-control", "none", "--clock-control", "base"], every),
        "clock_none_cache_none": (["--cache-control", "none", "--clock-control", "none"], every),
        "without_sass": (base, [m for m in every if m not in sass]),
        "sass_only": (base, sass),
        "without_sm_throughput": (base, [m for m in every if not m.startswith("sm__throughput")]),
        "duration_only": (base, ["gpu__time_duration.sum"]),
        "duration_only_nvtx": (["--nvtx", *base], ["gpu__time_duration.sum"]),
        "default_nvtx": (["--nvtx", *base], every),
    }
    for name, group in groups.items():
        table[f"{name}_alone"] = (base, ["gpu__time_duration.sum", *group])
    for name, group in groups.items():
        table[f"without_{name}"] = (base, [m for m in every if m not in group])
    for dtypes in (("fp64",), ("fp64", "fp8"), ("fp64", "tf32"), ("fp64", "fp8", "tf32")):
        dropped = [m for m in groups["flop_tensor"] if m.removeprefix("sm__ops_path_tensor_src_").startswith(dtypes)]
        table[f"without_flop_tensor_{'_'.join(dtypes)}"] = (base, [m for m in every if m not in dropped])
    return table


def measure(ncu: str, child: Path, iterations: int, options: list[str], metrics: list[str],
            footprint_gib: int = 0, pinned_mib: int = 0, launch_count: int | None = None) -> dict[str, object]:
    """One ncu run of the child (holding `footprint_gib` GiB more device memory and `pinned_mib` MiB of pinned host
    memory; replaying its first `launch_count` kernels, or all): passes per kernel, kernels replayed, window seconds."""
    count = ["--launch-count", str(launch_count)] if launch_count else []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [ncu, "--profile-from-start", "off", "--replay-mode", "kernel", *options, *count,
               "--metrics", ",".join(metrics), "--export", str(Path(tmp) / "r"), "--force-overwrite",
               sys.executable, str(child), str(iterations), str(footprint_gib),
               str(pinned_mib)]
        code, timed_out = run_child(cmd, Path(tmp) / "ncu.log", TIMEOUT_S)
        lines = (Path(tmp) / "ncu.log").read_text(encoding="utf-8", errors="replace").splitlines()
    passes = [n for line in lines if (n := replayed_passes(line)) is not None]
    window = [float(line.split()[1]) for line in lines if line.startswith("WINDOW_S")]
    if code != 0 or timed_out or not window or not passes:
        return {"error": "\n".join(lines[-6:])}
    return {"passes": sorted(set(passes)), "kernels": len(passes), "window_s": round(window[0], 3),
            "s_per_kernel": round(window[0] / len(passes), 4),
            "ms_per_pass": round(1000 * window[0] / sum(passes), 2)}


def main() -> int:
    """Run every variant and print (and optionally write) the table."""
    table = variants()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", choices=list(WINDOWS), default="small",
                        help="what the window runs: a small loop (default) or a ResNet-50 training step")
    parser.add_argument("--iterations", type=int, default=None,
                        help="loop iterations (steps) in the window (default 6 for the small loop, 1 for a step)")
    parser.add_argument("--launch-count", type=int, default=None, help="replay only the window's first N kernels")
    parser.add_argument("--only", nargs="*", choices=list(table), metavar="VARIANT",
                        help=f"variants to run (default: all): {', '.join(table)}")
    parser.add_argument("--footprint-gib", type=int, nargs="*", default=[], metavar="GIB",
                        help="also run the default variant holding this many GiB more device memory (each)")
    parser.add_argument("--pinned-mib", type=int, nargs="*", default=[], metavar="MIB",
                        help="also run the default variant holding this many MiB of pinned host memory (each)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    ncu = find_ncu()
    if ncu is None:
        print("ncu not found: set $NCU or install Nsight Compute", file=sys.stderr)
        return 2
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        child = Path(tmp) / "window.py"
        child.write_text(WINDOWS[args.window], encoding="utf-8")
        iterations = args.iterations or (6 if args.window == "small" else 1)
        for name, (options, metrics) in table.items():
            if args.only and name not in args.only:
                continue
            results[name] = measure(ncu, child, iterations, options, metrics, launch_count=args.launch_count)
            print(name, json.dumps(results[name]), flush=True)
        options, metrics = table["default"]
        for gib in args.footprint_gib:
            name = f"default_holding_{gib}_gib"
            results[name] = measure(ncu, child, iterations, options, metrics, gib, launch_count=args.launch_count)
            print(name, json.dumps(results[name]), flush=True)
        for mib in args.pinned_mib:
            name = f"default_pinning_{mib}_mib"
            results[name] = measure(ncu, child, iterations, options, metrics, pinned_mib=mib,
                                    launch_count=args.launch_count)
            print(name, json.dumps(results[name]), flush=True)
    if args.out:
        write_json_atomic(args.out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
