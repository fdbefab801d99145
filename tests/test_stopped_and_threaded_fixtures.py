"""Two recorded H200 runs at the edges of the ncu pass: one stopped by --max-kernels, one whose forward
launches from two host threads. Expected values are recomputed from the raw nsys export (SQL) and ncu report
(ncu_report)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from fixtures_util import kernels_of, match_in_launch_order, raw_ncu_actions, raw_window_kernels, run_dir

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from plugins.ncu.command import default_metrics, is_replayed_kernel

if importlib.util.find_spec("ncu_report") is None:  # read in a child process: it must not share one with torch
    pytest.skip("ncu_report is installed by the test extra", allow_module_level=True)

NAMES = default_metrics()


def _counters(action) -> dict[str, tuple[float, str]]:
    return {key: action.values[name] for key, name in NAMES.items()}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    return run_dir("conv_block_eager_max5", tmp_path_factory)


@pytest.fixture(scope="module")
def threaded(tmp_path_factory):
    return run_dir("two_threads_eager", tmp_path_factory)


def test_max_kernels_stopped_ncu_after_five_replays_and_kept_them(stopped):
    manifest = json.loads((stopped / "manifest.json").read_text())
    ncu = next(p for p in manifest["passes"] if p["name"] == "ncu")
    assert ncu["stopped_early"] == "condition"
    assert "ncu_variants" not in {p["name"] for p in manifest["passes"]}, "a targeted replay has no variant pass"
    log = (stopped / "ncu" / "output.log").read_text().splitlines()
    assert sum(map(is_replayed_kernel, log)) == 5
    assert len(raw_ncu_actions(stopped / "ncu" / "report.ncu-rep", [])) == 5


def test_launches_of_replayed_configurations_carry_counters_and_the_rest_are_named(stopped):
    raw = raw_window_kernels(stopped / "nsys" / "report.sqlite")
    actions = raw_ncu_actions(stopped / "ncu" / "report.ncu-rep", list(NAMES.values()))
    replayed = dict(zip(match_in_launch_order(actions, raw), actions, strict=True))
    configs = {(raw[j].mangled, raw[j].grid, raw[j].block): a for j, a in replayed.items()}
    profile = assemble(RunDir(stopped))
    kernels = kernels_of(profile)
    assert len(kernels) == len(raw) == 23
    with_counters = 0
    for j, (kernel, row) in enumerate(zip(kernels, raw, strict=True)):
        action = configs.get((row.mangled, row.grid, row.block))
        if action is None:
            assert kernel.metrics == {}
            continue
        with_counters += 1
        assert {key: (m.value, m.unit) for key, m in kernel.metrics.items()} == _counters(action)
        assert (kernel.propagated_from is None) == (j in replayed)
    assert profile.window.kernels_with_counters == with_counters == 9
    assert "the ncu pass was stopped at --max-kernels: only the kernels it replayed before then carry counters" in (
        profile.warnings)
    first_missing = next(j for j, row in enumerate(raw) if (row.mangled, row.grid, row.block) not in configs)
    assert any(w.startswith(f"{len(raw) - with_counters} window launches have no ncu counters: ncu was stopped")
               and f"launch {first_missing} " in w for w in profile.warnings)
    assert not any("mismatch" in w for w in profile.warnings)


def test_launches_from_two_host_threads_are_all_replayed_and_joined(threaded):
    raw = raw_window_kernels(threaded / "nsys" / "report.sqlite")
    assert len({row.global_tid for row in raw}) == 3 and len({row.stream for row in raw}) == 3
    actions = raw_ncu_actions(threaded / "ncu" / "report.ncu-rep", list(NAMES.values()))
    replayed = dict(zip(match_in_launch_order(actions, raw), actions, strict=True))
    profile = assemble(RunDir(threaded))
    kernels = kernels_of(profile)
    assert profile.window.kernels_with_counters == profile.window.kernel_count == len(kernels) == len(raw) == 51
    for j, (kernel, row) in enumerate(zip(kernels, raw, strict=True)):
        assert (kernel.correlation_id, kernel.stream_id) == (row.correlation_id, row.stream)
        source = j if j in replayed else kernel.propagated_from
        assert source in replayed and raw[source].config == row.config
        assert {key: (m.value, m.unit) for key, m in kernel.metrics.items()} == _counters(replayed[source])
    assert not any("mismatch" in w for w in profile.warnings)


def test_worker_thread_launches_are_listed_unattributed_with_the_reason(threaded):
    profile = assemble(RunDir(threaded))
    raw = raw_window_kernels(threaded / "nsys" / "report.sqlite")
    from_workers = [row for row in raw if row.global_tid != raw[-1].global_tid]
    assert len(profile.unattributed_kernels) == len(from_workers) == 50
    assert f"{len(from_workers)} unattributed kernel(s) were launched from a thread other than the measure range's, " \
        "in no operator range (a thread of the workload's own): nothing names their operator" in profile.warnings
