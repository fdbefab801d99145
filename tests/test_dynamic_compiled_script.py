"""A serving script that compiles its own model with dynamic shapes, replayed from its H200 recording.

`h200_dynamic_encoder_serve.profile.json.xz`: scripts/gpu_workloads/dynamic_encoder_serve.py as it is (`run --script
--window-fn serve --steps 4:4`: a text encoder compiled with `torch.compile(dynamic=True)` serving batches padded
to four lengths), recorded by `scripts/record_real_workloads.py --cases dynamic_encoder_serve` on an H200 on
2026-11-30. One compiled graph serves every length; the run's own compile mode is eager, and the analysis said only
"compile eager" of a window whose every generated kernel came from the script's own compile.
"""

from __future__ import annotations

from pathlib import Path

from fixtures_util import recorded_profile

from mcp_server.analysis import analyze_profile
from mcp_server.analysis.diagnosis import format_summary


def test_a_window_the_script_compiled_itself_says_so_and_keeps_its_modules(tmp_path: Path) -> None:
    profile = recorded_profile("h200_dynamic_encoder_serve", tmp_path)
    assert profile.capture_metadata.compile_mode == "eager"
    generated = [op for op in profile.operators if op.operator_name.startswith("triton_")]
    graphs = {op.compiled_graph for op in profile.operators if op.compiled_graph}
    assert generated and len(graphs) == 1 and all(op.compiled_graph in graphs for op in generated)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert all(op.module_path for op in profile.operators)  # the blocks' extern GEMMs included
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    assert analysis.configuration.compile_mode == "eager (the workload's own torch.compile: 1 compiled graph(s) ran)"
    assert "| compile eager (the workload's own torch.compile: 1 compiled graph(s) ran) |" in format_summary(analysis)
    # compiled already: no advice to compile it, and the host waits for each batch's embeddings at the script's line
    assert not any("torch.compile" in o.title and "Fuse" in o.title for o in analysis.opportunities)
    copies = [s for s in analysis.syncs or [] if s.api == "cudaMemcpyAsync" and s.copy_kind == "DtoH"]
    assert copies and {s.call_site.rsplit("/", 1)[-1] for s in copies if s.call_site} == {"dynamic_encoder_serve.py:71"}
