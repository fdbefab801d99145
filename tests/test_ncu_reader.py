"""ncu report → counter records with units and NVTX stacks, on recorded H100 reports (ncu 2025.3.1)."""

from __future__ import annotations

import math
import sqlite3

import pytest
from fixtures_util import extract_fixture

from plugins.ncu.command import default_metrics
from plugins.ncu.reader import NcuReportError, read_ncu_report
from plugins.nsys.reader import read_nsys_sqlite
from plugins.nvtx_names import MEASURE_RANGE

ncu_report = pytest.importorskip("ncu_report")

WORKLOADS = ["conv_block_eager", "conv_block_inductor", "gpt2_eager", "gpt2_inductor"]
# ncu ran with --filter-mode per-launch-config --launch-count 1: one record per launch configuration.
RECORDS = {"conv_block_eager": 14, "conv_block_inductor": 19, "gpt2_eager": 22, "gpt2_inductor": 18}
# Unique (demangled name, grid, block) among the same workload's nsys window kernels.
DEMANGLED_CONFIGS = {"conv_block_eager": 14, "conv_block_inductor": 19, "gpt2_eager": 23, "gpt2_inductor": 18}
PERCENT_KEYS = [
    "dram_throughput_pct", "memory_throughput_pct", "sm_throughput_pct", "l1_throughput_pct", "l2_throughput_pct",
    "l1_hit_rate_pct", "l2_hit_rate_pct", "tensor_pipe_active_pct", "tensor_hmma_active_pct",
    "achieved_occupancy_pct", "theoretical_occupancy_pct", "issue_active_pct",
]
# `l1tex__throughput.avg.pct_of_peak_sustained_active` is relative to *active* cycles and passes 100 on tiny kernels.
OVER_100 = {("conv_block_inductor", 1, "l1_throughput_pct"), ("gpt2_eager", 12, "l1_throughput_pct")}


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """workload -> extracted run folder (nsys/, ncu/, torch/ passes)."""
    return {w: extract_fixture(f"h100_{w}", tmp_path_factory) for w in WORKLOADS}


@pytest.fixture(scope="session")
def reports(runs):
    """workload -> NcuCapture with the default metrics."""
    return {w: read_ncu_report(run / "ncu" / "report.ncu-rep") for w, run in runs.items()}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_records_and_no_missing_metric(reports, workload):
    report = reports[workload]
    assert len(report.records) == RECORDS[workload]
    assert [r.ordinal for r in report.records] == list(range(RECORDS[workload]))
    assert report.missing_metrics == []
    assert report.warnings == []
    assert report.device_name == "NVIDIA H100 80GB HBM3"
    assert report.ncu_version == "2025.3.1"
    for record in report.records:
        assert set(record.metrics) == set(default_metrics())


@pytest.mark.parametrize("workload", WORKLOADS)
def test_units_and_ranges(reports, workload):
    over = set()
    for r in reports[workload].records:
        m = r.metrics
        assert m["duration"].unit == "ns" and m["duration"].value > 0
        assert m["dram_bytes_read"].unit == "byte" and m["dram_bytes_read"].value > 0
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


@pytest.mark.parametrize("workload", WORKLOADS)
def test_stacks_start_at_the_measure_range(reports, workload):
    for r in reports[workload].records:
        assert (r.stack[0].kind, r.stack[0].name) == ("annotation", MEASURE_RANGE)
        if workload.endswith("_eager"):
            assert any(f.kind == "op" for f in r.stack)
        elif r.name.startswith("triton_"):
            assert (r.stack[-1].kind, r.stack[-1].name) == ("annotation", r.name)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_records_are_first_launches_of_each_config_in_nsys(runs, reports, workload):
    """ncu replayed the first launch of each (function name, grid, block), in launch order, with its stack."""
    nsys_db = runs[workload] / "nsys" / "report.sqlite"
    kernels = read_nsys_sqlite(nsys_db).kernels
    with sqlite3.connect(nsys_db) as conn:
        short = dict(conn.execute(
            "SELECT k.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
        ))
    first: dict[tuple, int] = {}
    for k in kernels:
        first.setdefault((short[k.correlation_id], k.grid, k.block), k.ordinal)
    assert len({(k.name, k.grid, k.block) for k in kernels}) == DEMANGLED_CONFIGS[workload]
    assert len(first) == RECORDS[workload]

    actions = ncu_report.load_report(str(runs[workload] / "ncu" / "report.ncu-rep")).range_by_idx(0)
    records = reports[workload].records
    assert [(actions.action_by_idx(r.ordinal).name(), r.grid, r.block) for r in records] == list(first)
    for record, ordinal in zip(records, first.values(), strict=True):
        kernel = kernels[ordinal]
        assert (record.name, record.mangled_name) == (kernel.name, kernel.mangled_name)
        frames = [(f.kind, f.name, f.input_shapes) for f in record.stack]
        assert frames == [(f.kind, f.name, f.input_shapes) for f in kernel.stack]
        assert record.metrics["registers_per_thread"].value == kernel.registers_per_thread
        smem = record.metrics["shared_mem_static_bytes"].value + record.metrics["shared_mem_dynamic_bytes"].value
        assert smem == kernel.shared_memory_bytes


def test_template_instances_sharing_a_function_name_are_profiled_once(runs, reports):
    """gpt2 eager: the copy kernel has no record of its own; ncu grouped it with the add kernel (same config)."""
    kernels = read_nsys_sqlite(runs["gpt2_eager"] / "nsys" / "report.sqlite").kernels
    profiled = {(r.name, r.grid, r.block) for r in reports["gpt2_eager"].records}
    unprofiled = {(k.name, k.grid, k.block) for k in kernels} - profiled
    assert len(unprofiled) == 1
    ((name, grid, block),) = unprofiled
    assert "direct_copy_kernel_cuda" in name and (grid, block) == ((8, 1, 1), (128, 1, 1))
    assert [k.ordinal for k in kernels if k.name == name] == [7, 8, 14, 16, 34, 35, 41, 43]
    add = reports["gpt2_eager"].records[2]
    assert "CUDAFunctor_add" in add.name and (add.grid, add.block) == ((8, 1, 1), (128, 1, 1))
    assert name.split("<")[0] == add.name.split("<")[0] == "void at::native::elementwise_kernel"


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
