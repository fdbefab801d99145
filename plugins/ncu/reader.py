"""Read an Nsight Compute report (.ncu-rep) into `CounterRecord`s with the `ncu_report` module.

Each profiled kernel becomes one record, in report (= launch) order, holding the requested metrics under their
metrics.yaml keys with the unit ncu reported, its launch geometry and its NVTX push/pop stack. A key whose metric
the report lacks but whose breakdown inputs it holds (metrics.yaml `busiest_of`) takes the largest of them. ncu drops
an unknown metric name without a word, so every requested name that no kernel returned is listed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from mcp_server.schema.profile import Metric
from mcp_server.schema.records import CounterRecord, Frame
from plugins.ncu.command import default_metrics, metric_inputs
from plugins.nvtx_names import parse_range

# Launch and device attributes ncu records for every kernel whatever the metric list (ncu 2025.3).
GRID_METRICS = ("launch__grid_dim_x", "launch__grid_dim_y", "launch__grid_dim_z")
BLOCK_METRICS = ("launch__block_dim_x", "launch__block_dim_y", "launch__block_dim_z")
GRID_SIZE_METRIC = "launch__grid_size"
STREAM_METRIC = "launch__stream_id"
BLOCK_SIZE_METRIC = "launch__block_size"
DEVICE_NAME_METRIC = "device__attribute_display_name"


class NcuReportError(Exception):
    """The report cannot be read; the message says what to do."""


class BusiestOf(BaseModel):
    """A key read as the largest of some inputs of its metric's breakdown, the report lacking the metric itself."""

    metric: str = Field(description="The ncu breakdown metric the key stands for.")
    inputs: list[str] = Field(description="The inputs of its breakdown that were collected.")


class NcuCapture(BaseModel):
    """The kernels one ncu report profiled."""

    records: list[CounterRecord] = Field(default_factory=list, description="Profiled kernels in launch order.")
    missing_metrics: list[str] = Field(
        default_factory=list,
        description="Requested ncu metric names no kernel returned (ncu drops unknown names); empty without kernels.",
    )
    ncu_version: str | None = Field(
        default=None,
        description="Version of the ncu_report module that read the report (it must match the ncu that wrote it; "
        "the module does not expose the writer's version).",
    )
    device_name: str | None = None
    warnings: list[str] = Field(default_factory=list)
    busiest_of: dict[str, BusiestOf] = Field(
        default_factory=dict,
        description="Keys whose value is the largest of some inputs of their metric's breakdown, the report lacking "
        "the metric itself: a lower bound of the metric, equal to it when its busiest input is among them.",
    )

    def derivation_notes(self) -> list[str]:
        """One line per derived key: what its value is, for the profile's notes."""
        return [f"{key}: the largest of {len(b.inputs)} inputs of the breakdown of ncu's {b.metric} (named in "
                "plugins/ncu/metrics.yaml), a lower bound of it" for key, b in self.busiest_of.items()]


def _ncu_report() -> Any:
    try:
        import ncu_report
    except ImportError as exc:
        raise NcuReportError(
            "the ncu_report module is not importable: `pip install ncu-report==<ncu version>` or add "
            "<nsight-compute>/extras/python to PYTHONPATH"
        ) from exc
    return ncu_report


def metric_value(metric: Any, ncu: Any) -> float | None:
    """A numeric metric's value, read by its value kind; None for strings and metrics without a value."""
    if metric is None or not metric.has_value():
        return None
    kind = metric.kind()
    if kind in (ncu.IMetric.ValueKind_UINT64, ncu.IMetric.ValueKind_UINT32):
        return float(metric.as_uint64())
    if kind in (ncu.IMetric.ValueKind_DOUBLE, ncu.IMetric.ValueKind_FLOAT):
        return float(metric.as_double())
    return None


def _int_metric(action: Any, name: str, ncu: Any) -> int | None:
    value = metric_value(action.metric_by_name(name), ncu)
    return None if value is None else int(value)


def _dims(action: Any, names: tuple[str, str, str], size_name: str, ncu: Any) -> tuple[int, int, int] | None:
    dims = [_int_metric(action, name, ncu) for name in names]
    if all(d is not None for d in dims):
        return (dims[0], dims[1], dims[2])  # type: ignore[return-value]
    size = _int_metric(action, size_name, ncu)
    return None if size is None else (size, 1, 1)


def _stack(action: Any) -> list[Frame]:
    """Push/pop ranges open at the launch, every domain, outermost first (ncu keeps no timestamps)."""
    state = action.nvtx_state()
    if state is None:
        return []
    frames: list[Frame] = []
    for domain_id in state.domains():
        domain = state.domain_by_id(domain_id)
        if domain is None:
            continue
        idx = 0
        while (nvtx_range := domain.push_pop_range(idx)) is not None:
            frames.append(parse_range(nvtx_range.name()))
            idx += 1
    return frames


def read_ncu_report(
    path: Path, metrics: dict[str, str] | None = None, inputs: dict[str, list[str]] | None = None,
    timeout_s: float = 600.0,
) -> NcuCapture:
    """Read every profiled kernel of an ncu report, with `metrics` (key -> ncu metric; default metrics.yaml).

    Metrics are stored under their keys as `Metric(value, unit)`, numbers typed by the metric's value kind. A key
    whose metric a kernel lacks takes the largest of its `inputs` that the kernel has (default: metrics.yaml's
    `busiest_of` for the keys asked for).
    The report is read in a child process: `ncu_report`'s native library changes the C++ global locale of the
    process that loads it, which breaks torch in the same process (and crashes if torch came first).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ncu report not found: {path} (ncu --export writes <name>.ncu-rep)")
    wanted = default_metrics() if metrics is None else dict(metrics)
    busiest_of = {key: names for key, names in (metric_inputs() if inputs is None else inputs).items() if key in wanted}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "plugins.ncu.reader", str(path.resolve()), json.dumps(wanted),
             json.dumps(busiest_of)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired as exc:
        raise NcuReportError(f"reading {path} took over {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise NcuReportError(last.removeprefix("NcuReportError: "))
    return NcuCapture.model_validate_json(proc.stdout)


def _largest(action: Any, names: list[str], ncu: Any, returned: set[str]) -> Metric | None:
    """The largest numeric value among the metrics `names` that the action holds, with its unit."""
    best: Metric | None = None
    for name in names:
        metric = action.metric_by_name(name)
        if metric is None:
            continue
        returned.add(name)
        value = metric_value(metric, ncu)
        if value is not None and (best is None or value > best.value):
            best = Metric(value=value, unit=metric.unit())
    return best


def _read_in_process(path: Path, wanted: dict[str, str], busiest_of: dict[str, list[str]]) -> NcuCapture:
    """The reading itself, in whichever process imports ncu_report."""
    ncu = _ncu_report()
    report = ncu.load_report(str(path))
    if report.num_ranges() == 0:  # what load_report gives for a corrupt or foreign file: no error, no ranges
        raise NcuReportError(
            f"{path} holds no profiled range: not an ncu report, or one from an ncu newer than "
            f"ncu_report {report.get_version()}; re-run ncu with --export, or install the matching ncu-report"
        )

    records: list[CounterRecord] = []
    returned: set[str] = set()
    non_numeric: set[str] = set()
    non_finite: dict[str, list[str]] = {}  # metric -> the kernels ncu gave NaN or infinity for it
    device_name: str | None = None
    not_kernels = 0
    derived: set[str] = set()
    for range_idx in range(report.num_ranges()):
        profiled_range = report.range_by_idx(range_idx)
        for action_idx in range(profiled_range.num_actions()):
            action = profiled_range.action_by_idx(action_idx)
            if action.workload_type() != ncu.IAction.WorkloadType_KERNEL:
                not_kernels += 1
            values: dict[str, Metric] = {}
            for key, metric_name in wanted.items():
                metric = action.metric_by_name(metric_name)
                if metric is None:
                    if key in busiest_of and (largest := _largest(action, busiest_of[key], ncu, returned)):
                        values[key] = largest
                        derived.add(key)
                    continue
                returned.add(metric_name)
                value = metric_value(metric, ncu)
                if value is None:
                    non_numeric.add(metric_name)
                    continue
                if not math.isfinite(value):
                    non_finite.setdefault(metric_name, []).append(action.name(ncu.IAction.NameBase_DEMANGLED))
                    continue
                values[key] = Metric(value=value, unit=metric.unit())
            if device_name is None:
                display = action.metric_by_name(DEVICE_NAME_METRIC)
                device_name = display.as_string() if display is not None else None
            records.append(
                CounterRecord(
                    ordinal=len(records),
                    name=action.name(ncu.IAction.NameBase_DEMANGLED),
                    mangled_name=action.name(ncu.IAction.NameBase_MANGLED) or None,
                    grid=_dims(action, GRID_METRICS, GRID_SIZE_METRIC, ncu),
                    block=_dims(action, BLOCK_METRICS, BLOCK_SIZE_METRIC, ncu),
                    stream=_int_metric(action, STREAM_METRIC, ncu),
                    metrics=values,
                    stack=_stack(action),
                )
            )

    warnings: list[str] = []
    if not records:
        warnings.append(f"{path} holds no profiled kernel: did the NVTX filter match the measured range?")
    if not_kernels:
        warnings.append(f"{not_kernels} record(s) profiled a CUDA graph or range as a whole, not one kernel")
    if non_numeric:
        warnings.append(f"metrics without a numeric value were skipped: {sorted(non_numeric)}")
    for name, kernels in sorted(non_finite.items()):
        warnings.append(f"ncu gave {name} no finite value (NaN or infinity) for {len(kernels)} kernel(s), left "
                        f"without it (first: {kernels[0][:120]})")
    requested = [name for key, name in wanted.items() if key not in busiest_of or name in returned]
    requested += [name for key in busiest_of if wanted[key] not in returned for name in busiest_of[key]]
    missing = [] if not records else [name for name in dict.fromkeys(requested) if name not in returned]
    if missing:
        warnings.append(f"ncu returned no value for {len(missing)} requested metric(s): {missing}")
    return NcuCapture(
        records=records,
        missing_metrics=missing,
        ncu_version=report.get_version() or None,
        device_name=device_name,
        warnings=warnings,
        busiest_of={key: BusiestOf(metric=wanted[key], inputs=busiest_of[key]) for key in wanted if key in derived},
    )


if __name__ == "__main__":
    try:
        print(_read_in_process(Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])).model_dump_json())
    except NcuReportError as error:
        print(f"NcuReportError: {error}", file=sys.stderr)
        sys.exit(2)
