"""Real CPU runs of the capture harness through the CLI, on the shrunken examples (no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLE_NAMES, REPO

from mcp_server.schema.io import load_profile


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=300
    )


def test_seven_examples_exist():
    assert sorted([
        "conv_block", "depthwise_separable_conv", "embedding_projection", "gpt2", "lstm_sequence_encoder",
        "mlp_activations", "sdpa_attention",
    ]) == EXAMPLE_NAMES


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_profile_example_on_cpu(name, tmp_path, example):
    out = tmp_path / "run"
    proc = run_cli("profile", str(example(name)), "--backend", "torch", "--output", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(out / "profile.json")
    meta = profile.capture_metadata
    assert meta.gpu_used is False and meta.device_type == "cpu"
    assert "No GPU was used" in meta.notes[0]
    assert "NO GPU USED" in proc.stdout
    assert profile.operators, "a CPU profile lists the top-level operators"
    for op in profile.operators:
        assert op.aggregated.cpu_total_time_ns is not None and op.aggregated.cpu_total_time_ns >= 0
        assert 0 <= op.aggregated.cpu_self_time_ns <= op.aggregated.cpu_total_time_ns
        assert "," not in op.operator_name, "operator name is separate from its shapes"
    top_level = sum(op.aggregated.cpu_total_time_ns for op in profile.operators)
    assert top_level <= profile.window.wall_time_ns, "top-level operators cannot outlast the window"
    assert any(op.module_path for op in profile.operators), "eager runs carry module paths"
    assert (out / "torch" / "kineto_trace.json").is_file(), "the raw trace is kept in the run directory"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["backend"] == "torch" and manifest["passes"][0]["exit_code"] == 0


def test_module_paths_and_shapes_on_conv_block(tmp_path, example):
    out = tmp_path / "run"
    assert run_cli("profile", str(example("conv_block")), "-o", str(out), "-q").returncode == 0
    ops = {op.operator_id: op for op in load_profile(out / "profile.json").operators}
    conv = ops["aten::conv2d#0"]
    assert conv.module_path == "features.0.conv"
    assert conv.input_shapes[0] == [2, 3, 32, 32]
    assert conv.input_dtypes[0] == "float"
    assert ops["aten::conv2d#1"].module_path == "features.1.conv"


def test_inductor_on_cpu_gathers_provenance(tmp_path, example):
    out = tmp_path / "run"
    proc = run_cli("profile", str(example("mlp_activations")), "--compile-mode", "inductor", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    provenance = json.loads((out / "torch" / "inductor_provenance.json").read_text())
    assert provenance["generated_code"], "the harness copies Inductor's generated code into the run directory"
    assert any(v["module_path"].startswith("layers") for v in provenance["node_modules"].values())
    assert load_profile(out / "profile.json").capture_metadata.compile_mode == "inductor"


def test_train_step(tmp_path, example):
    out = tmp_path / "run"
    proc = run_cli("profile", str(example("mlp_activations")), "--train-step", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.run_mode == "train_step"
    names = {op.operator_name for op in profile.operators}
    assert any("backward" in n.lower() or n.startswith("autograd::") for n in names), names


def test_script_with_nvtx_capture_window(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", str(REPO / "tests" / "scripts" / "script_window.py"), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    names = {op.operator_name for op in load_profile(out / "profile.json").operators}
    assert "aten::linear" in names and "aten::relu" in names


def test_optimized_mode_runs_the_workloads_own_backend(tmp_path):
    out = tmp_path / "run"
    workload = REPO / "tests" / "workloads" / "conv_block_optimized.py"
    proc = run_cli("profile", str(workload), "--compile-mode", "optimized", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert load_profile(out / "profile.json").capture_metadata.compile_mode == "optimized"
    provenance = json.loads((out / "torch" / "inductor_provenance.json").read_text())
    assert provenance["generated_code"], "the backend delegated to Inductor: its generated code is kept"
    assert any(v["module_path"] == "features.0.conv" for v in provenance["node_modules"].values()), (
        "the registered backend was wrapped so the FX graph's module paths were recorded"
    )
    assert load_profile(out / "profile.json").capture_metadata.cuda_graph_trees is False, "Inductor's defaults"
    assert load_profile(out / "profile.json").capture_metadata.cudnn_benchmark is False, "cuDNN's default"


def test_the_profile_says_when_the_workload_turned_cudnn_s_autotuner_on(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", str(REPO / "tests" / "workloads" / "tiny_mlp_cudnn_autotuned.py"), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert load_profile(out / "profile.json").capture_metadata.cudnn_benchmark is True


def test_optimized_mode_records_a_torch_compile_with_a_mode(tmp_path):
    """`torch.compile(model, mode=...)` never looks the backend up in the registry: its graphs are recorded where
    Inductor compiles them, so the generated kernels take their modules."""
    out = tmp_path / "run"
    workload = REPO / "tests" / "workloads" / "tiny_mlp_compiled_optimized.py"
    proc = run_cli("profile", str(workload), "--compile-mode", "optimized", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    provenance = json.loads((out / "torch" / "inductor_provenance.json").read_text())
    assert {"fc1", "fc2"} <= {v.get("module_path") for v in provenance["node_modules"].values()}
    assert [g["kind"] for g in provenance["graphs"]][:1] == ["dynamo"]
    gemms = [op.module_path for op in load_profile(out / "profile.json").operators if op.operator_name == "aten::addmm"]
    assert gemms == ["fc1", "fc2"], "the library calls inside the compiled graph take their call sites' modules"
    assert load_profile(out / "profile.json").capture_metadata.cuda_graph_trees is True, "mode='reduce-overhead'"


def test_optimized_mode_needs_the_optimized_contract(tmp_path, example):
    proc = run_cli("profile", str(example("conv_block")), "--compile-mode", "optimized", "-o", str(tmp_path / "r"))
    assert proc.returncode == 1
    assert "needs BACKEND_NAME and optimize(model)" in proc.stderr


def test_run_without_nsys_and_ncu_says_there_are_no_counters(tmp_path, example):
    proc = run_cli("run", str(example("mlp_activations")), "-o", str(tmp_path / "run"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "warning: no hardware counters" in proc.stdout and "operator-profiler preflight" in proc.stdout
    assert load_profile(tmp_path / "run" / "profile.json").capture_metadata.tool == "torch_profiler"
