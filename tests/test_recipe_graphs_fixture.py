"""CUDA-graph trees captured inside a compiled graph's call (the frontier's most common winner,
`torch.compile(mode="reduce-overhead")` in the workload's own optimize(); scripts/gpu_workloads/decoder_stack_recipe.py,
`run --compile-mode optimized`, recorded on an H200 by scripts/record_real_workloads.py --cases
recipe_graphs,fp8_graphs).
The fp8 recording's workload names a backend (`BACKEND_NAME = "inductor"`) that torch.compile with a mode never looks
up: its graphs are recorded where Inductor compiles them.

The graphs are captured inside Inductor's `## Call CompiledFxGraph` range, which began before the capture turned the
ranges on: the replayed library kernels (cuBLAS GEMMs, cuDNN attention) take their capture's operator and the
module of their call site in the generated code. Expected values come from the raw SQLite export and the generated
code, not from the pipeline.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fixtures_util import extract_fixture, raw_window_kernels

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir

RUN = "recipe_graphs"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return extract_fixture(f"h200_{RUN}", tmp_path_factory) / RUN


@pytest.fixture(scope="module")
def profile(run_dir):
    return assemble(RunDir(run_dir))


@pytest.fixture(scope="module")
def fp8_run(tmp_path_factory):
    return extract_fixture("h200_fp8_graphs", tmp_path_factory) / "fp8_graphs"


def _raw_extern_sites(pass_dir: Path, call: str) -> list[str]:
    """The module of each `extern_kernels.<call>(` site of the generated code that holds them, in order: the
    innermost module among its FX source nodes, as the harness recorded them."""
    index = json.loads((pass_dir / "inductor_provenance.json").read_text(encoding="utf-8"))
    modules = {node: entry.get("module_path") for node, entry in index["node_modules"].items()}
    sites: list[str] = []
    for code in index["generated_code"]:
        nodes: list[str] = []
        found = []
        for line in (pass_dir / code).read_text(encoding="utf-8").splitlines():
            if "Source Nodes: [" in line:
                nodes = [n.strip() for n in line.split("Source Nodes: [", 1)[1].split("]", 1)[0].split(",")]
            elif f"extern_kernels.{call}(" in line:
                found.append(next(modules[n] for n in reversed(nodes) if modules.get(n)))
        sites = sites or found
    return sites


def test_the_window_is_replayed_from_graphs_the_workload_captured(run_dir, profile):
    raw = raw_window_kernels(run_dir / "nsys" / "report.sqlite")
    with sqlite3.connect(run_dir / "nsys" / "report.sqlite") as conn:
        replayed = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL "
                                "AND graphNodeId != 0").fetchone()[0]
    assert replayed > 40, "the window replays CUDA-graph trees"
    assert profile.window.kernel_count == len(raw)
    assert profile.window.attributed_kernel_time_pct == 100.0
    dropped = [w for w in profile.warnings if "launched outside the 'operator_profiler::measure' range" in w]
    assert len(dropped) == 1 and dropped[0].endswith("were dropped (the warm-up and graph captures, traced so that "
                                                     "each replay takes its capture's ranges)")


def test_replayed_gemms_take_the_module_of_their_call_site(run_dir, profile):
    expected = _raw_extern_sites(run_dir / "nsys", "mm")
    gemms = [op.module_path for op in profile.operators if op.operator_name == "aten::mm"]
    assert len(expected) == 28 and gemms == expected
    assert gemms[:7] == [f"blocks.0.{m}" for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up",
                                                     "mlp.down")]


def test_module_paths_cover_the_window(profile):
    assert profile.window.module_path_kernel_time_pct > 99.0  # 11.6 % before the compiled call's range was kept
    attention = [op.module_path for op in profile.operators if "scaled_dot_product" in op.operator_name]
    assert attention == [f"blocks.{i}.attn" for i in range(4)]


def test_fp8_gemms_inside_a_mode_compiled_graph_take_their_modules(fp8_run):
    profile = assemble(RunDir(fp8_run))
    expected = _raw_extern_sites(fp8_run / "nsys", "_scaled_mm")
    gemms = [op for op in profile.operators if op.operator_name == "aten::_scaled_mm"]
    assert len(expected) == 28 and [op.module_path for op in gemms] == expected
    assert profile.window.module_path_kernel_time_pct > 99.0  # 0.0 % when the mode's compile went unrecorded
    flops = [k.metrics["flop_tensor_fp8"].value for op in gemms for k in op.kernels]
    assert all(f > 0 for f in flops), "the FP8 GEMMs count FP8 tensor-core operations"
    assert not any("does not hold" in w for w in profile.warnings), "every node's capture is in the timeline"
    assert any(w.startswith("61 window kernel(s) were replayed from graph nodes captured outside every operator")
               for w in profile.warnings), "the generated kernels launch under no operator range"
