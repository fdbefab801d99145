"""A plain training script's recorded profile, read as a user would: `scripts/gpu_workloads/vae_train.py` (a
convolutional VAE, float16 autocast with a GradScaler, two micro-batches per optimizer step, a DataLoader that pins)
under `run --script` on an H200 (`scripts/record_real_workloads.py --cases vae_train`, 2026-11-29), its passes
holding torch to their share of the CPUs. Before that share, the three passes' 16 threads each made every DataLoader
batch take about 0.5 s and the window measured without the profiler read 0.9 s, GPU busy 1.7 %: a launch-overhead
verdict that was the profiler's own doing."""

from __future__ import annotations

from fixtures_util import recorded_profile

from mcp_server.analysis import analyze_profile


def test_the_window_is_one_optimizer_step_of_two_micro_batches_measured_as_the_script_runs(tmp_path) -> None:
    profile = recorded_profile("h200_vae_train", tmp_path)
    window = profile.window
    assert window.unprofiled_wall_time_ns is not None and window.unprofiled_wall_time_ns < 50_000_000
    assert window.unprofiled_gpu_busy_time_ns is not None
    assert window.unprofiled_gpu_busy_time_ns > 0.3 * window.unprofiled_wall_time_ns, "the GPU busy, not idle"
    assert set(window.kernel_time_by_phase_ns) == {"forward", "backward", "optimizer"}
    assert window.attributed_kernel_time_pct == 100.0 and window.module_path_kernel_time_pct > 95
    copies = [e for e in profile.runtime_events or [] if e.kind == "memcpy" and e.copy_kind == "HtoD"]
    assert len(copies) == 2 and all(e.src_memory == "pinned" for e in copies), "each micro-batch's pinned batch"


def test_the_grad_scaler_s_read_back_is_named_and_gates_the_cuda_graph_advice(tmp_path) -> None:
    analysis = analyze_profile(recorded_profile("h200_vae_train", tmp_path), out_dir=tmp_path / "analysis")
    assert analysis.diagnosis.bottleneck.value == "latency", "the GPU's kernels, not the host, as the script runs"
    graphs = next(o for o in analysis.opportunities if o.change_class == "cuda_graphs")
    assert any("vae_train.py:84" in need for need in graphs.prerequisites), graphs.prerequisites
