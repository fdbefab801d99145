"""ncu report → counter records with units and NVTX stacks, on recorded H200 reports (ncu 2025.3.1).

The reports were written by `ncu --kernel-name-base mangled --filter-mode per-launch-config --launch-count 1`
restricted to the measure range. Expected values are read from the report with `ncu_report` directly and from
the nsys export of the same run with SQL (tests/fixtures_util.py), and pinned below.
"""

from __future__ import annotations

import importlib.util
import lzma
import math

import pytest
from fixtures_util import FIXTURES, NSYS_RUNS, match_in_launch_order, raw_ncu_actions, raw_window_kernels, run_dir

from mcp_server.children.contract import MEASURE_RANGE
from plugins.ncu.command import default_metrics
from plugins.ncu.reader import NcuCapture, NcuReportError, read_ncu_report
from plugins.nsys.reader import read_nsys_sqlite

if importlib.util.find_spec("ncu_report") is None:  # never imported here: it must not share a process with torch
    pytest.skip("ncu_report is installed by the test extra", allow_module_level=True)

# Profiled kernels per report (count of ncu_report actions): keyed on mangled names, ncu replays exactly the first
# launch of each distinct (name, grid, block) among the same run's nsys window kernels.
RECORDS = {"conv_block_eager": 14, "conv_block_inductor": 19, "gpt2_eager": 23, "gpt2_inductor": 18}
PERCENT_KEYS = [
    "dram_throughput_pct", "memory_throughput_pct", "sm_throughput_pct", "l1_throughput_pct", "l2_throughput_pct",
    "l1_hit_rate_pct", "l2_hit_rate_pct", "tensor_pipe_active_pct", "tensor_hmma_active_pct",
    "achieved_occupancy_pct", "theoretical_occupancy_pct", "issue_active_pct",
]
# `l1tex__throughput.avg.pct_of_peak_sustained_active` is relative to *active* cycles and passes 100 on 1-block
# kernels: conv_block inductor's record 1 (a weight-layout Triton kernel), gpt2 eager's records 9 (a 1-block
# elementwise kernel) and 13 (cuBLAS scal_kernel).
OVER_100 = {("conv_block_inductor", 1, "l1_throughput_pct"), ("gpt2_eager", 9, "l1_throughput_pct"),
            ("gpt2_eager", 13, "l1_throughput_pct")}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """workload -> extracted nsys + ncu run directory."""
    return {w: run_dir(w, tmp_path_factory) for w in NSYS_RUNS}


@pytest.fixture(scope="session")
def reports(runs) -> dict[str, NcuCapture]:
    """workload -> NcuCapture with the default metrics."""
    return {w: read_ncu_report(run / "ncu" / "report.ncu-rep") for w, run in runs.items()}


@pytest.fixture(scope="session")
def raw_actions(runs):
    """workload -> the report's actions read with ncu_report, with every default metric."""
    names = list(default_metrics().values())
    return {w: raw_ncu_actions(run / "ncu" / "report.ncu-rep", names) for w, run in runs.items()}


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_records_and_no_missing_metric(reports, raw_actions, workload):
    report = reports[workload]
    assert len(raw_actions[workload]) == RECORDS[workload]
    assert len(report.records) == RECORDS[workload]
    assert [r.ordinal for r in report.records] == list(range(RECORDS[workload]))
    assert report.missing_metrics == []
    assert report.warnings == []
    assert report.device_name == "NVIDIA H200"
    assert report.ncu_version == "2025.3.1"
    for record in report.records:
        assert set(record.metrics) == set(default_metrics())


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_every_value_and_unit_is_the_reports_own(reports, raw_actions, workload):
    """Record by record, metric by metric: value and unit equal what ncu_report returns for the action."""
    names = default_metrics()
    for record, action in zip(reports[workload].records, raw_actions[workload], strict=True):
        assert (record.name, record.mangled_name, record.grid, record.block) == (
            action.demangled, action.mangled, action.grid, action.block
        )
        got = {key: (m.value, m.unit) for key, m in record.metrics.items()}
        assert got == {key: action.values[name] for key, name in names.items()}


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_units_and_ranges(reports, workload):
    over = set()
    for r in reports[workload].records:
        m = r.metrics
        assert m["duration"].unit == "ns" and m["duration"].value > 0
        assert m["dram_bytes_read"].unit == "byte" and m["dram_bytes_read"].value >= 0
        assert m["dram_bytes_write"].unit == "byte"
        assert m["inst_executed"].unit == "inst" and m["inst_executed"].value > 0
        assert m["registers_per_thread"].unit == "register/thread"
        assert m["sm_clock_hz"].unit == "hz" and m["sm_count"].value == 132
        for key in PERCENT_KEYS:
            assert m[key].unit == "%" and m[key].value >= 0
            if m[key].value > 100:
                over.add((workload, r.ordinal, key))
        assert math.prod(r.grid) == m["grid_size"].value and math.prod(r.block) == m["block_size"].value
        assert r.name and r.mangled_name
    assert over == {o for o in OVER_100 if o[0] == workload}


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_stacks_start_at_the_measure_range(reports, workload):
    for r in reports[workload].records:
        assert (r.stack[0].kind, r.stack[0].name) == ("annotation", MEASURE_RANGE)
        if workload.endswith("_eager"):
            assert any(f.kind == "op" for f in r.stack)
        elif r.name.startswith("triton_"):
            assert (r.stack[-1].kind, r.stack[-1].name) == ("annotation", r.name)


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_records_are_nsys_launches_in_launch_order(runs, reports, raw_actions, workload):
    """Each record is a later nsys launch than the previous one: its name, geometry, registers, shared memory and
    NVTX stack are that launch's; ncu replayed exactly the first launch of every (name, grid, block)."""
    nsys_db = runs[workload] / "nsys" / "report.sqlite"
    raw = raw_window_kernels(nsys_db)
    matched = match_in_launch_order(raw_actions[workload], raw)
    first: dict[tuple, int] = {}
    for i, k in enumerate(raw):
        first.setdefault(k.config, i)
    assert matched == sorted(first.values())
    assert len(matched) == RECORDS[workload]

    kernels = read_nsys_sqlite(nsys_db).kernels
    for record, j in zip(reports[workload].records, matched, strict=True):
        kernel = kernels[j]
        assert (record.name, record.mangled_name) == (raw[j].demangled, raw[j].mangled)
        frames = [(f.kind, f.name, f.input_shapes) for f in record.stack]
        assert frames == [(f.kind, f.name, f.input_shapes) for f in kernel.stack]
        assert record.metrics["registers_per_thread"].value == raw[j].registers
        assert record.metrics["shared_mem_static_bytes"].value == raw[j].static_smem
        assert record.metrics["shared_mem_dynamic_bytes"].value == raw[j].dynamic_smem


def test_template_instances_sharing_a_function_name_are_profiled_apart(runs, reports):
    """gpt2 eager: the copy and the add kernel share function name, grid and block; keyed on the demangled name,
    ncu profiles each (the run before --kernel-name-base demangled grouped them and left the copy without a record)."""
    raw = raw_window_kernels(runs["gpt2_eager"] / "nsys" / "report.sqlite")
    copy = [i for i, k in enumerate(raw) if "direct_copy_kernel_cuda" in k.demangled]
    assert copy == [7, 8, 14, 16, 34, 35, 41, 43]
    add = [i for i, k in enumerate(raw) if "CUDAFunctor_add" in k.demangled and k.grid == (8, 1, 1)]
    assert {raw[i].short for i in copy + add} == {"elementwise_kernel"}
    assert {(raw[i].grid, raw[i].block) for i in copy + add} == {((8, 1, 1), (128, 1, 1))}
    profiled = {r.name for r in reports["gpt2_eager"].records}
    assert raw[copy[0]].demangled in profiled and raw[add[0]].demangled in profiled


def test_chosen_metrics_and_a_name_ncu_does_not_know(runs):
    path = runs["conv_block_eager"] / "ncu" / "report.ncu-rep"
    chosen = {
        "duration": "gpu__time_duration.sum",
        "bogus": "bogus__metric.sum",
        "device": "device__attribute_display_name",
    }
    report = read_ncu_report(path, chosen)
    assert report.missing_metrics == ["bogus__metric.sum"]
    assert all(set(r.metrics) == {"duration"} for r in report.records)
    assert report.warnings == [
        "metrics without a numeric value were skipped: ['device__attribute_display_name']",
        "ncu returned no value for 1 requested metric(s): ['bogus__metric.sum']",
    ]


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="ncu report not found"):
        read_ncu_report(tmp_path / "absent.ncu-rep")
    junk = tmp_path / "junk.ncu-rep"
    junk.write_bytes(b"garbage" * 100)
    with pytest.raises(NcuReportError, match="no profiled range"):
        read_ncu_report(junk)


def test_a_metric_ncu_gives_no_finite_value_is_left_out_and_named(tmp_path):
    """cuDNN's NHWC batch-norm kernel on the H200 reports infinitely many waves per SM
    (scripts/record_ncu_infinite_metric.py): the record keeps its other counters, the warning names the metric."""
    report_path = tmp_path / "report.ncu-rep"
    report_path.write_bytes(lzma.decompress((FIXTURES / "h200_infinite_waves.ncu-rep.xz").read_bytes()))
    report = read_ncu_report(report_path)
    (record,) = report.records
    assert "batchnorm_fwtr_nhwc_semiPersist" in record.name
    assert "waves_per_sm" not in record.metrics and record.metrics["theoretical_occupancy_pct"].value >= 0
    assert ("ncu gave launch__waves_per_multiprocessor no finite value (NaN or infinity) for 1 kernel(s), left "
            "without it (first: void cudnn::batchnorm_fwtr_nhwc_semiPersist") in "\n".join(report.warnings)
