"""Record an ncu report in which ncu gives a metric no finite value, for tests/test_ncu_reader.py.

On an H200 (ncu 2025.3.1), some launches of cuDNN's NHWC batch-norm kernels in
`scripts/gpu_workloads/distill_train.py` (channels_last images) report `launch__waves_per_multiprocessor` as
infinity when ncu collects the capture's own metric list (`plugins/ncu/command.collected_metrics`, with its replay,
cache and clock settings). This profiles the kernel's first launches, finds the first such launch, and profiles it
alone into `<out>/<gpu>_infinite_waves.ncu-rep.xz` (needs ncu_report on the path).

    python scripts/record_ncu_infinite_metric.py --out "$OUT"
"""

from __future__ import annotations

import argparse
import lzma
import math
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from plugins.ncu.command import collected_metrics  # noqa: E402

KERNEL = "batchnorm_fwtr_nhwc_semiPersist"
METRIC = "launch__waves_per_multiprocessor"
LAUNCHES = 16  # how many of the kernel's first launches are searched


def profile(report: Path, device: str, skip: int, count: int) -> Path:
    """ncu over `count` launches of KERNEL after `skip`, as the capture collects them: the report's path."""
    subprocess.run(["ncu", "--kernel-name-base", "function", "--kernel-name", KERNEL, "--launch-skip", str(skip),
                    "--launch-count", str(count), "--replay-mode", "kernel", "--cache-control", "all",
                    "--clock-control", "base", "--metrics", ",".join(collected_metrics(device)), "-o", str(report),
                    sys.executable, str(REPO / "scripts" / "gpu_workloads" / "distill_train.py"), "--steps", "3"],
                   check=True, timeout=600, stdout=subprocess.DEVNULL)
    return report.with_suffix(".ncu-rep")


def first_infinite(path: Path) -> int | None:
    """The position of the first profiled launch whose METRIC is not finite."""
    import ncu_report

    report = ncu_report.load_report(str(path))
    actions = report.range_by_idx(0)
    for index in range(actions.num_actions()):
        metric = actions.action_by_idx(index).metric_by_name(METRIC)
        if metric is not None and metric.has_value() and not math.isfinite(metric.as_double()):
            return index
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--gpu", default="h200")
    args = parser.parse_args()
    device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                            text=True, check=True).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory() as tmp:
        index = first_infinite(profile(Path(tmp) / "search", device, 0, LAUNCHES))
        if index is None:
            sys.exit(f"none of the first {LAUNCHES} launches of {KERNEL} gave {METRIC} a non-finite value here")
        alone = profile(Path(tmp) / "alone", device, index, 1)
        if first_infinite(alone) != 0:
            sys.exit(f"launch {index} of {KERNEL} gave {METRIC} a finite value when profiled alone")
        args.out.mkdir(parents=True, exist_ok=True)
        target = args.out / f"{args.gpu}_infinite_waves.ncu-rep.xz"
        with lzma.open(target, "wb", preset=9) as packed:
            packed.write(alone.read_bytes())
    print(f"wrote {target}: launch {index} of {KERNEL}")


if __name__ == "__main__":
    main()
