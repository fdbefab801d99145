"""A model torch.compile does not compile at all, and a training step's attention counted by blocks.

On the CPU, `run --compile-mode inductor` of a boolean-mask filter inside a loop (tests/workloads/masked_loop.py):
Dynamo skips the whole forward and runs it eagerly, a graph break no compiled graph names. The profile records it at
its line, says the model did not compile, and records the window as an eager one (modules and call sites).
`h200_swin_train.profile.json.xz`: `scripts/record_real_workloads.py --cases swin_train` on an H200 (2026-11-29).
"""

from __future__ import annotations

import lzma
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from fixtures_util import FIXTURES

from mcp_server.analysis import analyze_profile
from mcp_server.schema.io import load_profile

WORKLOAD = REPO / "tests" / "workloads" / "masked_loop.py"


def _line(text: str) -> int:
    return next(n for n, line in enumerate(WORKLOAD.read_text().splitlines(), 1) if text in line)


def test_a_model_dynamo_skips_whole_is_said_not_to_compile_and_recorded_as_eager(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "run", str(WORKLOAD), "--compile-mode",
                           "inductor", "-o", str(out), "-q"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = load_profile(out / "profile.json")
    [skipped] = profile.capture_metadata.graph_breaks or []
    assert skipped.location == f"{WORKLOAD}:{_line('the graph breaks here')}"
    assert skipped.reason.endswith(": Dynamo skipped the function and ran it eagerly")
    assert "aten.nonzero" in skipped.reason and skipped.compile_id is None
    assert any(w.startswith("torch.compile compiled no graph: Dynamo ran the model eagerly, after graph breaks it "
                            f"could not handle at {WORKLOAD}:") for w in profile.warnings)
    linears = [op for op in profile.operators if op.operator_name == "aten::linear"]
    assert {op.module_path for op in linears} == {"score", "refine"}  # the window's module ranges, as eager's
    assert all(op.call_site is not None and op.call_site.startswith(str(WORKLOAD)) for op in linears)
    assert "torch.compile compiled no graph" in proc.stdout + proc.stderr


def test_a_training_steps_attention_is_counted_by_its_forward_blocks(tmp_path: Path) -> None:
    """Two Swin-style blocks' window attention written by hand, trained one AdamW step on the H200: the unfused
    attention's kernels form 2 runs in the forward and 12 more in the backward, interleaved with other gradients. The
    advice counts 2 blocks and their backward, not 14 blocks."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_swin_train.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert (profile.window.module_path_kernel_time_pct or 0) >= 95
    analysis = analyze_profile(profile, tmp_path / "out", profile_path=path, measure=False)
    [sdpa] = [o for o in analysis.opportunities if o.change_class == "sdpa_substitution"]
    assert sdpa.title == ("Replace 2 attention blocks and their backward by F.scaled_dot_product_attention (one "
                          "fused kernel each)")
