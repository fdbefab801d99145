"""Training scripts, a beam search and a video model of kinds the checks had not met, from their H200 profiles.

`h200_packed_lstm_tagger.profile.json.xz`: scripts/gpu_workloads/packed_lstm_tagger.py as it is (`run --script
--steps 4:3`: a bidirectional LSTM over random-length sentences through `pack_padded_sequence` /
`pad_packed_sequence`, `clip_grad_norm_`, SGD). `h200_distill_train.profile.json.xz`:
scripts/gpu_workloads/distill_train.py (`--steps 3:2`: a frozen teacher CNN under `no_grad` inside each step, a
student of the same class trained, channels_last). `h200_beam_search.profile.json.xz`:
scripts/gpu_workloads/beam_search.py (`--window-fn beam_search --steps 1:1`: an encoder-decoder decoding 4 beams of
32 sentences, its decoder's self-attention over a cache grown by `torch.cat` and reordered by `index_select`, its
cross-attention over the source, one module). `h200_video_classifier.profile.json.xz`:
scripts/gpu_workloads/video_classifier.py (a 3-D CNN, the workload contract). Recorded by
`scripts/record_real_workloads.py` on an H200 on 2026-11-30, after the fixes these tests name: before them the
LSTM's backward of `pad_packed_sequence`'s writes (152 `CopySlices` nodes, 267 copies) had no module and no line,
the first two steps' clipping was the forward's, and the distillation's run failed on an ncu metric without a
finite value. `h200_threaded_serve.profile.json.xz`: scripts/gpu_workloads/threaded_serve.py (`--window-fn serve
--steps 1:1`: a pool of two worker threads, started before the window, each running a CNN on a CUDA stream of its
own under `inference_mode`), recorded once the workers' operators were (before, torch.profiler and the call-site
ranges saw only threads started inside the window). `h200_jagged_encoder.profile.json.xz`:
scripts/gpu_workloads/jagged_encoder.py (`--window-fn encode --steps 2:2`: documents of random lengths as nested
jagged tensors through four blocks whose attention is SDPA on them), recorded once its nsys pass recorded no input
shapes (with them, torch's NVTX range failed on the first jagged operator's sizes, its end closed the window's range,
and the profile held 1 of 112 kernels). The beam search's analysis, replayed after two fixes: its beams expanded by
`repeat_interleave(4)` asked for static shapes first, and its growing cache went unseen (one module's two attentions
read as one site).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from fixtures_util import recorded_profile

from mcp_server.analysis import analyze_profile


def test_a_packed_lstms_every_step_clips_in_the_update_and_its_padding_writes_are_differentiated_there(
        tmp_path: Path) -> None:
    profile = recorded_profile("h200_packed_lstm_tagger", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    writes = [op for op in profile.operators if (op.autograd_node or "").endswith("CopySlices")]
    assert len(writes) == 152
    assert {(op.forward_op, op.module_path) for op in writes} == {("aten::_pad_packed_sequence", "Tagger")}
    assert {op.call_site.rsplit("/", 1)[-1] for op in writes if op.call_site} == {"packed_lstm_tagger.py:42"}
    copies = [e for e in profile.runtime_events or [] if e.kind == "memcpy" and e.origin == "workload"]
    assert copies and all(e.call_site for e in copies)
    # clip_grad_norm_ at line 85, in each of the window's three steps: the update's
    clipping = Counter(op.phase for op in profile.operators if op.call_site
                       and op.call_site.endswith("packed_lstm_tagger.py:85"))
    assert clipping == Counter({"optimizer": 3 * 8})


def test_a_distilled_students_update_is_its_own_and_the_teachers_forward_has_no_backward(tmp_path: Path) -> None:
    profile = recorded_profile("h200_distill_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    # the teacher was called first (bare paths), the student is the second ConvNet, named by the script's variable
    # for it (`student`, recorded once roots were; `ConvNet[1]` before): only it learns
    phases = Counter(((op.module_path or "").startswith("student"), op.phase) for op in profile.operators
                     if op.module_path)
    assert phases[(False, "backward")] == 0 and phases[(True, "backward")] > 0
    assert phases[(True, "forward")] > 0 and phases[(False, "forward")] > 0
    assert {op.module_path for op in profile.operators if op.phase == "optimizer"} == {"student"}
    assert sum("no finite value (NaN or infinity)" in w for w in profile.warnings) == 2
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    assert analysis.operators


def test_a_beam_searchs_growing_cache_is_found_beside_its_cross_attention(tmp_path: Path) -> None:
    profile = recorded_profile("h200_beam_search", tmp_path)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    grown = next(f for f in analysis.findings if f.kind == "growing_kv_cache")
    assert grown.module_paths == [f"decoder.{i}" for i in range(6)]
    assert {"key_length_min=1", "key_length_max=32"} <= set(grown.triggers)
    assert "static_kv_cache" in [o.change_class for o in analysis.opportunities]
    # the beams' expansion by a number has static shapes: nothing asks for them; the finished check's read does
    needs = [n for o in analysis.opportunities for n in o.prerequisites]
    assert not any("make the shapes static" in n for n in needs)
    assert not any(f.kind == "host_sync" and any("repeat_interleave" in op for op in f.operators)
                   for f in analysis.findings)


def test_a_3d_cnn_is_told_of_channels_last_3d(tmp_path: Path) -> None:
    """cuDNN converts the clips' NCDHW tensors around its tensor-core kernels: the layout that avoids it is
    channels_last_3d (channels_last lays out 4-d tensors and fails on 5-d weights)."""
    profile = recorded_profile("h200_video_classifier", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    convolutions = [op for op in profile.operators if op.operator_name == "aten::conv3d"]
    assert convolutions and all(op.module_path for op in convolutions)
    assert all(len(op.input_shapes[0]) == 5 for op in convolutions if op.input_shapes)
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    layout = [o for o in analysis.opportunities if o.change_class == "channels_last"]
    assert layout and all("channels_last_3d" in o.title for o in layout), [o.title for o in layout]
    assert not any("channels_last " in o.title or "channels_last;" in o.title for o in layout)


def test_a_pool_of_worker_threads_has_its_models_kernels_in_their_modules_at_their_lines(tmp_path: Path) -> None:
    profile = recorded_profile("h200_threaded_serve", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.window.call_site_kernel_time_pct == 100.0
    calls = Counter((op.operator_name, op.module_path is not None) for op in profile.operators if op.kernels)
    # four batches, two workers: each layer's calls are the model's
    assert calls[("aten::conv2d", True)] == 12 and calls[("aten::linear", True)] == 4
    assert calls[("aten::topk", False)] == 4  # the workers' own code, outside the model
    streams = {k.stream_id for op in profile.operators for k in op.kernels if op.operator_name == "aten::conv2d"}
    assert len(streams) == 2  # a stream per worker
    analysis = analyze_profile(profile, out_dir=tmp_path / "analysis", measure=False)
    graphs = [o for o in analysis.opportunities if o.change_class == "cuda_graphs"]
    assert graphs and all(any("threaded_serve.py:58" in n for n in o.prerequisites) for o in graphs)


def test_a_jagged_models_window_holds_its_kernels_in_their_modules(tmp_path: Path) -> None:
    profile = recorded_profile("h200_jagged_encoder", tmp_path)
    assert profile.window.kernel_count == 112 and profile.window.attributed_kernel_time_pct == 100.0
    assert (profile.window.module_path_kernel_time_pct or 0) > 99
    calls = Counter(op.operator_name for op in profile.operators if op.kernels and op.module_path)
    # two batches of four blocks: their projections, norms and flash attention
    assert calls["aten::linear"] == 2 * 4 * 4 and calls["aten::_flash_attention_forward"] == 2 * 4
    assert any("nested (jagged) tensors" in w for w in profile.warnings)
