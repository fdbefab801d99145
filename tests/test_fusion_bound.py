"""The fusion estimate and the speed-of-light floors against what compiling measured, on a GPU-bound graph
convolutional network (scripts/gpu_workloads/gcn.py: gathers, scales and index_add_ scatters along a million edges).

`h200_gcn.profile.json.xz`: `scripts/record_real_workloads.py --cases gcn` on an H200 (2026-11-29);
`h200_gcn_recipes.json.xz`: `operator-profiler recipes scripts/gpu_workloads/gcn.py --only compile+fp32` on the same
machine. Inductor fuses the gather and the scale into its own scatter, faster than ATen's index_add_ kernel alone: the
scatter is no work that fusion leaves as it is, and the floor of the eager kernels is no floor for the compiled code.
"""

from __future__ import annotations

import lzma
from pathlib import Path

from fixtures_util import FIXTURES

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.diagnosis import format_summary
from mcp_server.schema.io import load_profile
from mcp_server.schema.recipes import RecipesReport


def test_the_fusion_estimate_bounds_what_compiling_the_gcn_measured(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_gcn.profile.json.xz").read_bytes()))
    analysis = analyze_profile(load_profile(path), tmp_path / "out", profile_path=path, measure=False)
    frontier = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_gcn_recipes.json.xz").read_bytes()))
    eager, compiled = (frontier.result(name) for name in ("eager+fp32", "compile+fp32"))
    assert eager is not None and compiled is not None and compiled.tier == "exact"
    eager_ns, compiled_ns = eager.time_ns("latency"), compiled.time_ns("latency")
    assert eager_ns and compiled_ns and eager_ns / compiled_ns > 3  # 8.345 against 2.424 ms
    window = analysis.timeline.window_ns if analysis.timeline else 0
    measured_share = 1 - compiled_ns / eager_ns
    fuse = next(o for o in analysis.opportunities if o.change_class == "inductor_config")
    assert fuse.rank == 1 and fuse.estimated_saving_ns >= measured_share * window  # an upper bound holds
    sol = analysis.speed_of_light
    assert sol is not None and compiled_ns < sol.floor_ns  # the eager kernels' floor: compiled code ran below it
    assert compiled_ns > sol.plausible_floor_ns and eager_ns / compiled_ns < sol.max_plausible_speedup
    assert "fused kernels move fewer bytes and may go below it" in format_summary(analysis)
