"""ncu's per-launch-config deduplication on recorded runs where it used to lose kernels (H200, and H100 with the
manifest that records each ncu pass's options as data).

mlp_activations under Inductor launches eight distinct Triton kernels (`triton_poi_fused_addmm_<activation>_<n>`)
of one or two launch shapes. ncu keys its per-launch-config filter on (kernel name per --kernel-name-base, grid,
block, shared memory); plain Triton names do not demangle, so keyed on demangled names ncu took them for one
kernel and left 6 of 25 launches without counters on the H200 (full size). Keyed on mangled names every distinct
kernel is replayed. Expected values are recomputed from the raw nsys export (SQL) and ncu report (ncu_report).
"""

from __future__ import annotations

import importlib.util

import pytest
from fixtures_util import extract_fixture, match_in_launch_order, raw_ncu_actions, raw_window_kernels, run_dir

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import MANIFEST_VERSION
from mcp_server.schema.requests import NcuOptions
from plugins.ncu.command import default_metrics

if importlib.util.find_spec("ncu_report") is None:  # read in a child process: it must not share one with torch
    pytest.skip("ncu_report is installed by the test extra", allow_module_level=True)

RUN = "mlp_activations_inductor"


@pytest.fixture(scope="module", params=["h200", "h100"])
def run(request, tmp_path_factory):
    if request.param == "h200":  # recorded with a version 1.0 manifest (options only in the command line)
        return run_dir(RUN, tmp_path_factory)
    return extract_fixture(f"h100_{RUN}", tmp_path_factory) / RUN


def test_the_manifest_gives_the_ncu_pass_its_options_as_data(run):
    manifest = RunDir(run).read_manifest()
    assert manifest.manifest_version == MANIFEST_VERSION  # a 1.0 manifest is upgraded as it is read
    ncu = manifest.pass_named("ncu")
    assert ncu is not None and ncu.ncu == NcuOptions()  # `run`'s default: the whole window, deduplicated
    assert ncu.ncu.per_launch_config and not ncu.ncu.filters_launches


def test_every_distinct_triton_kernel_of_one_shape_is_replayed(run):
    raw = raw_window_kernels(run / "nsys" / "report.sqlite")
    actions = raw_ncu_actions(run / "ncu" / "report.ncu-rep", ["gpu__time_duration.sum"])
    triton = {k.mangled for k in raw if k.mangled.startswith("triton_")}
    shapes = {(k.grid, k.block) for k in raw if k.mangled in triton}
    assert len(triton) >= 8 and len(shapes) < len(triton), "distinct Triton kernels share launch shapes here"
    assert {a.mangled for a in actions} >= triton
    first: dict[tuple, int] = {}
    for i, k in enumerate(raw):
        first.setdefault((k.mangled, k.grid, k.block), i)
    assert match_in_launch_order(actions, raw) == sorted(first.values())


def test_every_launch_carries_counters_of_its_own_kernel(run):
    profile = assemble(RunDir(run))
    kernels = sorted((k for op in profile.operators for k in op.kernels), key=lambda k: k.kernel_id)
    assert profile.warnings == [] and profile.unattributed_kernels == []
    raw = raw_window_kernels(run / "nsys" / "report.sqlite")
    assert profile.window.kernels_with_counters == profile.window.kernel_count == len(kernels) == len(raw)
    assert all(set(k.metrics) == set(default_metrics()) for k in kernels)
    for k in kernels:
        if k.propagated_from is not None:
            assert kernels[k.propagated_from].mangled_name == k.mangled_name
            assert (kernels[k.propagated_from].grid, kernels[k.propagated_from].block) == (k.grid, k.block)
