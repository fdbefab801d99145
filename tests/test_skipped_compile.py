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


def test_a_script_whose_compiled_model_dynamo_skips_names_the_users_line(tmp_path: Path) -> None:
    """The same model compiled by a plain script run as it is (tests/scripts/masked_loop_script.py): the skip is
    recorded from the script's first compile on, at the model's own line, not at the frame Dynamo traced last (the
    call-site mode's, this package's, on the stack of a script run as it is). Its forward runs eagerly under
    torch.compile's frame callback, which compiled the module hooks and the call-site mode as frames of their own
    (Inductor ran the Linears, outside their modules): no longer."""
    script = REPO / "tests" / "scripts" / "masked_loop_script.py"
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mcp_server.cli", "run", "--script", str(script), "--window-fn",
                           "MaskedLoop", "--steps", "2:1", "-o", str(out), "-q"], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = load_profile(out / "profile.json")
    [skipped] = profile.capture_metadata.graph_breaks or []
    assert skipped.location == f"{WORKLOAD}:{_line('the graph breaks here')}" and "aten.nonzero" in skipped.reason
    # The skipped forward ran eagerly under torch.compile's frame callback; the module hooks and the call-site mode
    # were not compiled as frames of their own: the Linears ran as they do without the profiler, in their modules
    linears = [op for op in profile.operators if op.operator_name == "aten::linear"]
    assert {op.module_path for op in linears} == {"score", "refine"} and all(op.call_site for op in linears)
    assert not [op for op in profile.operators if op.operator_name in ("aten::addmm", "aten::as_strided")]

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


def test_on_the_gpu_a_skipped_model_is_advised_as_eager_code_with_its_mask_made_static_first(tmp_path: Path) -> None:
    """`h200_detector_compiled.profile.json.xz`: `scripts/record_real_workloads.py --cases detector_compiled` on an
    H200 (2026-11-29): a detector's boolean-mask filter in a loop over the batch, under --compile-mode inductor.
    Dynamo skipped the forward: the profile names the break at detector.py:30 and holds the eager window (module
    paths on every kernel). The CUDA-graph advice is eager code's (no compiled graph to replay), after the mask's
    shapes are made static: its 12 synchronisations are in aten::index, the boolean mask's nonzero inside it."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_detector_compiled.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    [skipped] = profile.capture_metadata.graph_breaks or []
    assert skipped.location.endswith("scripts/gpu_workloads/detector.py:30") and "aten.nonzero" in skipped.reason
    assert profile.window.module_path_kernel_time_pct == 100.0
    assert not any(op.compiled_graph for op in profile.operators)
    analysis = analyze_profile(profile, tmp_path / "out", profile_path=path, measure=False)
    first = analysis.opportunities[0]
    assert first.title == ("Capture the window in CUDA graphs: torch.compile(mode='reduce-overhead') — first make the "
                           "shapes static (aten::index at detector.py:30)")
    compile_it = next(o for o in analysis.opportunities if o.change_class == "graph_breaks")
    assert compile_it.title == ("Make the model compile: Dynamo ran it eagerly after 1 graph break(s) it could not "
                                "handle (detector.py:30) — first make the shapes static (aten::index at "
                                "detector.py:30)")
    assert compile_it.prerequisites and compile_it.prerequisites[0].startswith("make the shapes static")


def test_on_the_gpu_a_script_that_compiles_a_model_dynamo_skips_is_told_to_make_it_compile_first(
        tmp_path: Path) -> None:
    """`h200_detector_script.profile.json.xz`: `scripts/record_real_workloads.py --cases detector_script` on an H200
    (2026-11-29): the same detector compiled by a plain script of its own (`torch.compile(model)`), run as it is. The
    skip is recorded at the model's line, not in the profiler's hooks or call-site mode that ran around it (kept out
    of Dynamo); the window is the eager model's, every kernel with its module and its line. Compiling it is what the
    fusion advice asks for, so the two are one: make the model compile (its mask's shapes static first), then
    Inductor fuses its element-wise kernels."""
    path = tmp_path / "profile.json"
    path.write_bytes(lzma.decompress((FIXTURES / "h200_detector_script.profile.json.xz").read_bytes()))
    profile = load_profile(path)
    [skipped] = profile.capture_metadata.graph_breaks or []
    assert skipped.location.endswith("scripts/gpu_workloads/detector.py:30")
    assert skipped.reason.endswith("Dynamo skipped the function and ran it eagerly")
    assert profile.window.module_path_kernel_time_pct == profile.window.call_site_kernel_time_pct == 100.0
    assert {(op.call_site or "").rsplit("/", 1)[-1].split(":")[0] for op in profile.operators} == {"detector.py"}
    analysis = analyze_profile(profile, tmp_path / "out", profile_path=path, measure=False)
    first = analysis.opportunities[0]
    assert first.change_class == "graph_breaks"
    assert first.title == ("Make the model compile: Dynamo ran it eagerly after 1 graph break(s) it could not handle "
                           "(detector.py:30), then Inductor fuses 86 element-wise/normalisation kernels — first make "
                           "the shapes static (aten::index at detector.py:30)")
    assert "fusible_kernels=86" in first.triggers and first.kernel_time_saving_ns > 0
    assert not any(o.change_class == "inductor_config" for o in analysis.opportunities)
