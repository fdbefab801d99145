"""Locating ncu and building its command line: kernel replay restricted to the measured window."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mcp_server.schema.requests import NcuOptions
from plugins.executables import find_executable

NCU_GLOBS = ["/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu", "/usr/local/NVIDIA-Nsight-Compute*/ncu"]
METRICS_FILE = Path(__file__).with_name("metrics.yaml")
NCCL_KERNEL = r"(?:_Z\d+)?nccl"  # a collective's kernel, mangled (`_Z27ncclDevKernel_...`) or not
# NCCL's buffers in memory it maps itself (cuMem, and NVLink SHARP's multicast): ncu cannot save and restore them
# around a kernel's replay passes, and failed (UnknownError) on the first kernel it replayed after a collective of
# `nn.DataParallel`'s on two H200s; with NCCL's classic allocations it replays every kernel. What counters measure
# is unchanged.
REPLAY_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}


def find_ncu() -> str | None:
    """ncu from $NCU, PATH, or /opt/nvidia/nsight-compute/<version>/ncu."""
    return find_executable("ncu", "NCU", NCU_GLOBS)


@functools.cache
def _metrics_file() -> dict[str, Any]:
    """metrics.yaml, read once per process (callers only read it)."""
    return dict(yaml.safe_load(METRICS_FILE.read_text(encoding="utf-8")))


def default_metrics() -> dict[str, str]:
    """profile.json key -> the ncu metric it stands for, from metrics.yaml."""
    return {key: spec["metric"] for key, spec in _metrics_file()["metrics"].items()}


def metric_inputs() -> dict[str, list[str]]:
    """profile.json key -> the inputs of its metric's breakdown collected in its place (metrics.yaml `busiest_of`):
    the key's value is the largest of them when the report lacks the metric itself."""
    return {key: list(spec["busiest_of"]) for key, spec in _metrics_file()["metrics"].items()
            if spec.get("busiest_of")}


def busiest_of_applies(device_name: str | None) -> bool:
    """Whether the `busiest_of` inputs stand in for their metrics on this GPU (nvidia-smi's name): only on the
    devices metrics.yaml lists (`busiest_of_devices`), where they were chosen and checked."""
    return device_name is not None and any(d in device_name for d in _metrics_file()["busiest_of_devices"])


def collected_metrics(device_name: str | None) -> list[str]:
    """The ncu metric names the capture asks for on `device_name`: each key's metric, or its inputs where they
    stand in for it there."""
    inputs = metric_inputs() if busiest_of_applies(device_name) else {}
    names: dict[str, None] = {}
    for key, metric in default_metrics().items():
        names.update(dict.fromkeys(inputs.get(key, [metric])))
    return list(names)


PROFILED_LINE = re.compile(r"^==PROF== Profiling .* - (\d+) pass(?:es)?$")  # "- 1 pass" with one pass


def replayed_passes(line: str) -> int | None:
    """The passes of the kernel replay an ncu output line reports completed; None for any other line."""
    match = PROFILED_LINE.match(line.strip())
    return int(match.group(1)) if match else None


def is_replayed_kernel(line: str) -> bool:
    """Whether an ncu output line reports one kernel's replay completed (all its passes)."""
    return replayed_passes(line) is not None


def capture_command(ncu: str, report_base: Path, options: NcuOptions, cuda_graphs: bool = False,
                    device_name: str | None = None) -> list[str]:
    """The ncu prefix: kernel replay of the window's kernels, those launched between the harness's
    cudaProfilerStart and cudaProfilerStop on any host thread (an NVTX range filter would see only the
    launches of the thread that opened `operator_profiler::measure`). NVTX ranges are still recorded.
    `cuda_graphs`: the workload replays CUDA graphs, whose kernels ncu profiles node by node. `device_name`
    (nvidia-smi's) decides the metric names (`collected_metrics`)."""
    return [*_sudo(options), ncu, "--target-processes", "application-only", "--nvtx",
            *profile_options(report_base, options, cuda_graphs, device_name)]


def launch_command(ncu: str, port: int, options: NcuOptions) -> list[str]:
    """The ncu prefix that starts the workload suspended at its first CUDA call, until `attach_command` connects
    on the ports from `port` on with what to replay (its CPU-side start-up, imports included, runs meanwhile)."""
    return [*_sudo(options), ncu, "--mode", "launch", "--target-processes", "application-only", "--nvtx",
            "--port", str(port)]


def attach_command(ncu: str, port: int, report_base: Path, options: NcuOptions, cuda_graphs: bool = False,
                   device_name: str | None = None) -> list[str]:
    """The ncu command that attaches to a workload started by `launch_command` on `port` and replays its window.

    Both take ncu's default range of ports from `port` on: the launcher holds one of them and the workload
    another (limited to one port, ncu 2025.3 found no process to attach to)."""
    return [*_sudo(options), ncu, "--mode", "attach", "--hostname", "127.0.0.1", "--port", str(port),
            *profile_options(report_base, options, cuda_graphs, device_name)]


def profile_options(report_base: Path, options: NcuOptions, cuda_graphs: bool = False,
                    device_name: str | None = None) -> list[str]:
    """What ncu replays (the window, filtered) and collects (the default metrics for `device_name`, plus any set
    or section). NVTX recording (`--nvtx`) is set where the workload starts: an attaching ncu refuses it."""
    cmd = [
        "--profile-from-start", "off", "--kernel-name-base", "mangled",
        "--replay-mode", "kernel", "--cache-control", "all", "--clock-control", "base",
        "--metrics", ",".join(collected_metrics(device_name)),
        "--force-overwrite", "--export", str(report_base),
    ]
    if options.metric_set:
        cmd += ["--set", options.metric_set]
    for section in options.sections:
        cmd += ["--section", section]
    cmd += ["--kernel-name", f"regex:{replayed_kernels(options.kernel_regex)}"]
    if options.launch_skip is not None:
        cmd += ["--launch-skip", str(options.launch_skip)]
    if options.per_launch_config:
        cmd += ["--filter-mode", "per-launch-config", "--launch-count", "1"]
    elif options.launch_count is not None:
        cmd += ["--launch-count", str(options.launch_count)]
    if cuda_graphs:
        cmd += ["--graph-profiling", "node"]
    return cmd


def replayed_kernels(named: str | None) -> str:
    """The `--kernel-name` regex of a pass: the kernels `named` matches (all when None), but the collectives' (NCCL).
    Replaying a collective's kernel alone waits for peers that are not replaying it: the other ranks, or the other
    GPUs of a process that runs `nn.DataParallel` (ncu failed there: UnknownError)."""
    return f"^(?!{NCCL_KERNEL})" + (f"(?:.*?(?:{named}).*)" if named else ".*")


def replay_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` for a workload under ncu's replay: `REPLAY_ENV` added where the user set none of its variables."""
    return {**environ, **{k: v for k, v in REPLAY_ENV.items() if k not in environ}}


def is_collective(mangled_name: str) -> bool:
    """A collective's (NCCL) kernel, which no ncu pass replays."""
    return re.match(NCCL_KERNEL, mangled_name) is not None


def _sudo(options: NcuOptions) -> list[str]:
    return ["sudo", "-n", "--preserve-env"] if options.ncu_sudo else []
