"""Throughput percentages read as the busiest of a few inputs of ncu's breakdown (metrics.yaml `busiest_of`).

Two recordings from an H100 (ncu 2025.3.1):
- `h100_ncu_throughput_breakdowns.json.xz` (benchmarks/ncu_throughput_probe.py): 105 kernels of varied kinds, each with
  the five `*__throughput` metrics and every input of their breakdowns at the same roll-up, from one ncu replay;
- `h100_mlp_activations_eager.tar.xz` (scripts/record_gpu_fixtures.py): `operator-profiler run` on the example, with
  the default metric set as it stands, which collects the inputs and not the four throughputs themselves.
"""

from __future__ import annotations

import importlib.util
import json
import lzma

import pytest
from fixtures_util import FIXTURES, extract_fixture, raw_ncu_actions

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import NcuOptions
from plugins.ncu.command import collected_metrics, default_metrics, metric_inputs, profile_options

BREAKDOWNS = FIXTURES / "h100_ncu_throughput_breakdowns.json.xz"
RUN = "mlp_activations_eager"
# Kernels of the 105 on which the busiest named input equals the metric (to 0.01 points), and the largest gap.
EQUAL = {"sm_throughput_pct": 105, "l1_throughput_pct": 105, "l2_throughput_pct": 104, "memory_throughput_pct": 103}
LARGEST_GAP = {"sm_throughput_pct": 0.0, "l1_throughput_pct": 0.0, "l2_throughput_pct": 0.33,
               "memory_throughput_pct": 4.62}


@pytest.fixture(scope="module")
def breakdowns() -> dict:
    return json.loads(lzma.decompress(BREAKDOWNS.read_bytes()))


def test_the_capture_asks_for_the_inputs_in_place_of_the_four_throughputs_on_a_gh100():
    inputs = metric_inputs()
    assert sorted(inputs) == ["l1_throughput_pct", "l2_throughput_pct", "memory_throughput_pct", "sm_throughput_pct"]
    for device in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GH200 480GB"):
        names = collected_metrics(device)
        assert len(names) == len(set(names))
        assert not {default_metrics()[key] for key in inputs} & set(names)
        assert {name for group in inputs.values() for name in group} <= set(names)
        assert {m for key, m in default_metrics().items() if key not in inputs} <= set(names)
        command = profile_options(FIXTURES / "r", NcuOptions(), device_name=device)
        assert command[command.index("--metrics") + 1].split(",") == names


def test_other_gpus_and_an_unknown_one_collect_the_four_metrics_whole():
    """The inputs were chosen and checked on GH100 only: another chip's breakdowns may differ."""
    for device in ("NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA GeForce RTX 4090", None):
        assert collected_metrics(device) == list(default_metrics().values())
        command = profile_options(FIXTURES / "r", NcuOptions(), device_name=device)
        assert command[command.index("--metrics") + 1].split(",") == list(default_metrics().values())


def test_every_named_input_is_an_input_of_its_metrics_breakdown(breakdowns):
    for key, names in metric_inputs().items():
        assert breakdowns["throughputs"][key] == default_metrics()[key]
        assert set(names) <= set(breakdowns["breakdown_inputs"][key]), key


def test_ncu_reports_each_throughput_as_the_largest_of_its_breakdown(breakdowns):
    """What the reading rests on: the metric is the max of its breakdown's inputs, on every recorded kernel."""
    assert len(breakdowns["kernels"]) == 105
    for key, metric in breakdowns["throughputs"].items():
        for kernel in breakdowns["kernels"]:
            values = kernel["values"]
            largest = max(values[n] for n in breakdowns["breakdown_inputs"][key] if n in values)
            assert values[metric] == pytest.approx(largest, abs=1e-6), (key, kernel["name"])


def test_the_named_inputs_give_the_metric_or_a_lower_bound(breakdowns):
    for key, names in metric_inputs().items():
        metric = default_metrics()[key]
        gaps = [k["values"][metric] - max(k["values"][n] for n in names) for k in breakdowns["kernels"]]
        assert min(gaps) >= -1e-6, key  # never above the metric: every name is one of its inputs
        assert sum(g < 0.01 for g in gaps) == EQUAL[key], key
        assert max(gaps) == pytest.approx(LARGEST_GAP[key], abs=0.01), key


@pytest.mark.skipif(importlib.util.find_spec("ncu_report") is None, reason="ncu_report is installed by the test extra")
def test_a_run_with_the_default_set_reads_each_throughput_from_its_inputs(tmp_path_factory):
    run = extract_fixture(f"h100_{RUN}", tmp_path_factory) / RUN
    inputs = metric_inputs()
    exact = [default_metrics()[key] for key in inputs]
    actions = raw_ncu_actions(run / "ncu" / "report.ncu-rep", exact + [n for g in inputs.values() for n in g])
    assert actions and all(not set(exact) & set(a.values) for a in actions)  # the report lacks the four

    profile = assemble(RunDir(run))
    assert profile.warnings == [] and profile.unattributed_kernels == []
    kernels = sorted((k for op in profile.operators for k in op.kernels), key=lambda k: k.kernel_id)
    assert profile.window.kernels_with_counters == len(kernels)
    assert all(set(k.metrics) == set(default_metrics()) for k in kernels)
    replayed = [k for k in kernels if k.propagated_from is None]
    assert len(replayed) == len(actions)
    for kernel, action in zip(replayed, actions, strict=True):
        assert kernel.mangled_name == action.mangled
        for key, names in inputs.items():
            largest = max(action.values[n][0] for n in names)
            assert kernel.metrics[key].value == largest and kernel.metrics[key].unit == "%"
    notes = [n for n in profile.capture_metadata.notes if "breakdown" in n]
    assert [n.split(":")[0] for n in notes] == list(inputs)
    assert all("lower bound" in n and default_metrics()[n.split(":")[0]] in n for n in notes)
