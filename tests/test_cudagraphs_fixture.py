"""CUDA-graph replays (conv_block, `--compile-mode cudagraphs`, full size, recorded on an H200).

A replayed graph's library kernels (cuDNN, cuBLAS) run with no operator range around them; they are placed by
the generated call()'s launch order between the generated kernels that anchor it. Expected values come from
the raw SQLite export and the generated code (tests/fixtures_util.py), not from the pipeline.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fixtures_util import extract_fixture, raw_node_modules, raw_window_kernels

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import AttributionMethod, Confidence

RUN = "conv_block_cudagraphs"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return extract_fixture(f"h200_{RUN}", tmp_path_factory) / RUN


@pytest.fixture(scope="module")
def profile(run_dir):
    return assemble(RunDir(run_dir))


def test_every_replayed_kernel_is_kept_and_attributed(run_dir, profile):
    raw = raw_window_kernels(run_dir / "nsys" / "report.sqlite")
    with sqlite3.connect(run_dir / "nsys" / "report.sqlite") as conn:
        graph_launched = conn.execute(
            "SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL AND graphNodeId != 0"
        ).fetchone()[0]
    assert graph_launched > 20, "the window replays a CUDA graph"
    assert profile.window.kernel_count == len(raw) == 31
    assert profile.unattributed_kernels == []
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.window.kernels_with_counters == 31


def _raw_convolution_sites(pass_dir: Path) -> list[list[str]]:
    """Source FX nodes of each `extern_kernels.convolution(` call, anywhere in the generated module (a
    CUDA-graph build puts them in partition functions, outside call())."""
    index = json.loads((pass_dir / "inductor_provenance.json").read_text(encoding="utf-8"))
    (code,) = index["generated_code"]
    sites, nodes = [], []
    for line in (pass_dir / code).read_text(encoding="utf-8").splitlines():
        if "Source Nodes: [" in line:
            nodes = [n.strip() for n in line.split("Source Nodes: [", 1)[1].split("]", 1)[0].split(",")]
        elif "extern_kernels.convolution(" in line:
            sites.append(nodes)
    return sites


def test_library_kernels_take_their_call_site_in_order(run_dir, profile):
    pass_dir = run_dir / "nsys"
    modules = raw_node_modules(pass_dir)
    expected = [
        next(modules[n] for n in reversed(nodes) if n in modules and modules[n].endswith("conv"))
        for nodes in _raw_convolution_sites(pass_dir)
    ]
    convs = [op for op in profile.operators if op.operator_name == "aten::convolution"]
    assert [op.module_path for op in convs] == expected == [f"features.{i}.conv" for i in (0, 1, 3, 4, 6, 7)]
    replayed = [k for op in convs for k in op.kernels]
    assert all(k.attribution.method == AttributionMethod.INDUCTOR_PROVENANCE for k in replayed)
    assert all(k.attribution.confidence == Confidence.MEDIUM for k in replayed)
    assert all(k.attribution.detail.startswith("CUDA graph replay") for k in replayed)
    (addmm,) = [op for op in profile.operators if op.operator_name == "aten::addmm"]
    assert addmm.module_path == "classifier" and addmm.aggregated.kernel_count == 2


def test_operator_times_sum_to_the_window(profile):
    total = sum(op.aggregated.total_duration_ns for op in profile.operators)
    assert total == profile.window.kernel_time_ns
