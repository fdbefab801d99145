"""Device peaks: match the profiled GPU in knowledge/devices.yaml, or measure them by microbenchmark.

Peaks are dense and quoted at a clock (devices.yaml says which); `peak_at_clock` rescales one to the SM clock
a kernel ran at under ncu replay, so achieved/peak counts work per elapsed SM cycle, as Nsight Compute does.
An unknown GPU gets peaks measured by the microbenchmark child under the workload's own interpreter.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from mcp_server.analysis.rules import KnowledgeError, knowledge
from mcp_server.errors import BackendUnavailable, CaptureFailed, WorkloadError
from mcp_server.process import child_command, interpreter_env, run_child
from mcp_server.schema.analysis import DeviceSpec
from mcp_server.schema.io import read_model, write_model_atomic

MEASURED_SOURCE = "measured by microbenchmark"
PEAKS_FILE = "device_peaks.json"
EXIT_NO_CUDA, EXIT_NO_TORCH = 3, 4


def _devices() -> dict[str, dict]:
    table = knowledge("devices").get("devices")
    if not isinstance(table, dict) or not table:
        raise KnowledgeError("knowledge/devices.yaml lists no devices", "restore the devices: mapping")
    return table


def precision_key(counter_precision: str) -> str | None:
    """Peak key of devices.yaml for a FLOP key of profile.json (e.g. tensor_tf32 -> tf32_tensor)."""
    return knowledge("devices").get("precision_of_counter", {}).get(counter_precision)


def spec_from_entry(key: str, entry: dict, reported_name: str | None = None) -> DeviceSpec:
    """A DeviceSpec from one devices.yaml entry (TFLOP/s -> FLOP/s, GB/s -> bytes/s, MB -> bytes)."""
    clocks = entry.get("clocks_mhz") or {}
    at_tensor_clock = set(knowledge("devices").get("quoted_at_tensor_clock", []))
    peaks: dict[str, float] = {}
    quoted: dict[str, float] = {}
    for precision, tflops in (entry.get("peak_tflops") or {}).items():
        if tflops is None:
            continue
        peaks[precision] = float(tflops) * 1e12
        clock = clocks.get("tensor") if precision in at_tensor_clock else clocks.get("boost")
        if clock:
            quoted[precision] = float(clock)
    notes = [] if clocks.get("boost") else ["clock of the published peaks unknown: peaks used unscaled"]
    l2_mb, mem_gb, bw = entry.get("l2_mb"), entry.get("memory_gb"), entry.get("dram_gb_per_s")
    return DeviceSpec(
        key=key, name=entry["name"], reported_name=reported_name, source=" ".join(str(entry["source"]).split()),
        architecture=entry.get("architecture"), sm_count=entry.get("sm_count"),
        base_clock_mhz=clocks.get("base"), boost_clock_mhz=clocks.get("boost"),
        peak_flop_per_s=peaks, peak_clock_mhz=quoted,
        dram_bandwidth_bytes_per_s=float(bw) * 1e9 if bw else None,
        l2_bytes=int(l2_mb * 1024 * 1024) if l2_mb else None,
        memory_bytes=int(mem_gb * 1e9) if mem_gb else None, notes=notes,
    )


def match_device(reported_name: str | None) -> DeviceSpec | None:
    """The devices.yaml entry whose explicit patterns match the name torch reported, else None."""
    if not reported_name:
        return None
    name = reported_name.strip()
    for key, entry in _devices().items():
        if any(re.search(pattern, name) for pattern in entry.get("match", [])):
            return spec_from_entry(key, entry, reported_name)
    return None


def peak_at_clock(device: DeviceSpec, precision: str, clock_mhz: float | None) -> float | None:
    """Peak FLOP/s of `precision` at `clock_mhz` (per-clock peak x clock); unscaled when a clock is unknown."""
    peak = device.peak_flop_per_s.get(precision)
    if peak is None:
        return None
    quoted = device.peak_clock_mhz.get(precision)
    if quoted and clock_mhz:
        return peak * clock_mhz / quoted
    return peak


def _spec_from_measurement(data: dict) -> DeviceSpec:
    dev = data.get("device", {})
    clock = dev.get("sm_clock_mhz")
    peaks = {k: float(v) for k, v in data.get("peak_flop_per_s", {}).items() if v}
    notes = [
        "peaks are achieved rates of the microbenchmark (matmul and copy), below theoretical peaks: "
        "percentages of them read high",
        *data.get("notes", []),
    ]
    return DeviceSpec(
        key=None, name=dev.get("name", "unknown"), reported_name=dev.get("name"), measured=True,
        source=MEASURED_SOURCE, sm_count=dev.get("sm_count"),
        peak_flop_per_s=peaks, peak_clock_mhz={k: float(clock) for k in peaks} if clock else {},
        dram_bandwidth_bytes_per_s=data.get("dram_bandwidth_bytes_per_s"), l2_bytes=dev.get("l2_bytes"),
        memory_bytes=dev.get("memory_bytes"), notes=notes,
    )


def measure_peaks(
    python: str, timeout_s: float = 600.0, allow_cpu: bool = False, size: int | None = None
) -> DeviceSpec:
    """Measure matmul FLOP/s per precision and copy bandwidth with the microbenchmark child under `python`.

    The child runs in its own process group (run_child). `allow_cpu` measures the CPU instead of refusing
    (tests, and a sanity check of the child on machines without CUDA); `size` overrides the matmul size.
    """
    with tempfile.TemporaryDirectory(prefix="op_microbench_") as tmp:
        out, log = Path(tmp) / "peaks.json", Path(tmp) / "microbench.log"
        cmd = child_command(python, "microbench", "--out", str(out))
        if allow_cpu:
            cmd.append("--allow-cpu")
        if size is not None:
            cmd += ["--size", str(size)]
        code, timed_out = run_child(cmd, log, timeout_s, env=interpreter_env(python))
        tail = " | ".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:])
        if timed_out:
            raise CaptureFailed(f"the peak microbenchmark ran past {timeout_s:.0f} s", "retry on an idle GPU")
        if code == EXIT_NO_TORCH:
            raise WorkloadError(f"{python} cannot import torch", "pass the interpreter that runs the workload")
        if code == EXIT_NO_CUDA:
            raise BackendUnavailable(
                f"the peak microbenchmark found no CUDA device under {python}",
                "run analyze on the machine that has the GPU, or add the GPU to knowledge/devices.yaml",
            )
        if code != 0 or not out.is_file():
            raise CaptureFailed(f"the peak microbenchmark failed (exit {code}): {tail}", "read the error above")
        data = json.loads(out.read_text(encoding="utf-8"))
    return _spec_from_measurement(data)


def load_measured(path: Path) -> DeviceSpec:
    """A DeviceSpec saved by `save_measured` (device_peaks.json)."""
    return read_model(Path(path), DeviceSpec, "device_peaks.json", "delete it to re-measure")


def save_measured(spec: DeviceSpec, path: Path) -> None:
    """Keep measured peaks beside the analysis so re-analysing does not re-measure."""
    write_model_atomic(Path(path), spec)
