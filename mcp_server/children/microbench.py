"""Peak microbenchmark child: achievable matmul FLOP/s per precision and copy bandwidth (stdlib + torch only).

    python microbench.py --out peaks.json [--size 8192] [--reps 10] [--allow-cpu]

Runs under the workload's own interpreter (the engine never imports torch) when a GPU is missing from
knowledge/devices.yaml. Each matmul is square (size x size x size, 2*size^3 FLOPs) and timed with CUDA events
(host timer on the CPU); the best of `--reps` calls is kept, as a peak is the best the device sustains. The
copy moves a buffer to another (bytes read + written). Results are achieved rates, labelled "measured by
microbenchmark" by the engine: below theoretical peaks. Exit codes: 0 ok, 3 no CUDA device (without
--allow-cpu), 4 torch missing, 1 anything else.
"""

from __future__ import annotations

if __name__ == "__main__":
    import _operator_profiler_child  # noqa: F401 - stops with the engine; this folder off sys.path

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_ERROR, EXIT_NO_CUDA, EXIT_NO_TORCH = 0, 1, 3, 4


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Operator Profiler peak microbenchmark")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--size", type=int, default=None, help="matmul size (default 8192 on a GPU, 512 on a CPU)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--allow-cpu", action="store_true", help="measure the CPU when no CUDA device exists")
    return parser.parse_args(argv)


class _Timer:
    """Best-of-N timing of a callable: CUDA events on a GPU, perf_counter_ns on the CPU."""

    def __init__(self, torch: Any, cuda: bool) -> None:
        self.torch, self.cuda = torch, cuda

    def best_seconds(self, fn: Any, reps: int) -> float:
        for _ in range(2):
            fn()
        self._sync()
        best = float("inf")
        for _ in range(reps):
            if self.cuda:
                start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter_ns()
                fn()
                best = min(best, (time.perf_counter_ns() - t0) / 1e9)
        return best

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def _sm_clock_mhz() -> float | None:
    """Current SM clock of GPU 0 from nvidia-smi (read only, never set), None without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        out = subprocess.run([smi, f"--id={visible}", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return float(out.strip().splitlines()[0])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def _matmul_peaks(torch: Any, timer: _Timer, device: str, size: int, reps: int, cc: tuple[int, int]) -> dict:
    """Best achieved FLOP/s of a square matmul per precision the device supports."""
    cases: list[tuple[str, Any, bool]] = [("fp32", torch.float32, False)]
    if device == "cuda" and cc >= (8, 0):
        cases += [("tf32_tensor", torch.float32, True), ("bf16_tensor", torch.bfloat16, False)]
    if device == "cuda" and cc >= (7, 0):
        cases.append(("fp16_tensor", torch.float16, False))
    peaks: dict[str, float] = {}
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for key, dtype, tf32 in cases:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
            seconds = timer.best_seconds(lambda a=a, b=b: torch.mm(a, b), reps)
            peaks[key] = 2.0 * size**3 / seconds
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return peaks


def _copy_bandwidth(torch: Any, timer: _Timer, device: str, nbytes: int, reps: int) -> float:
    """Best achieved bytes/s of a device-to-device copy (read + write)."""
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    seconds = timer.best_seconds(lambda: dst.copy_(src), reps)
    return 2.0 * src.numel() * 4 / seconds


def measure(args: argparse.Namespace, torch: Any) -> dict:
    """Measure on the first CUDA device (or the CPU with --allow-cpu)."""
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    timer = _Timer(torch, cuda)
    if cuda:
        props = torch.cuda.get_device_properties(0)
        cc = (props.major, props.minor)
        info = {
            "name": torch.cuda.get_device_name(0), "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None), "memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}.{props.minor}",
        }
        size = args.size or 8192
        copy_bytes = min(1 << 30, props.total_memory // 8)
    else:
        cc = (0, 0)
        info = {"name": f"cpu ({platform.processor() or platform.machine()})", "sm_count": None, "l2_bytes": None,
                "memory_bytes": None, "compute_capability": None}
        size = args.size or 512
        copy_bytes = 64 << 20
    peaks = _matmul_peaks(torch, timer, device, size, args.reps, cc)
    info["sm_clock_mhz"] = _sm_clock_mhz() if cuda else None
    bandwidth = _copy_bandwidth(torch, timer, device, copy_bytes, args.reps)
    notes = [f"matmul {size}x{size}x{size}, best of {args.reps}; copy of {copy_bytes} bytes, best of {args.reps}",
             "fp64 and fp8 not measured"]
    if cuda and info["sm_clock_mhz"] is None:
        notes.append("SM clock unknown (no nvidia-smi): peaks are used unscaled")
    return {"status": "ok", "device": info, "peak_flop_per_s": peaks, "dram_bandwidth_bytes_per_s": bandwidth,
            "torch_version": torch.__version__, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        import torch
    except ImportError:
        print("operator_profiler_microbench: torch is not importable", file=sys.stderr)
        return EXIT_NO_TORCH
    if not torch.cuda.is_available() and not args.allow_cpu:
        print("operator_profiler_microbench: no CUDA device", file=sys.stderr)
        return EXIT_NO_CUDA
    result = measure(args, torch)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)
    print(f"operator_profiler_microbench: {json.dumps(result['peak_flop_per_s'])}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
