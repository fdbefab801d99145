"""memory.json replayed on CPU from memory passes recorded on an H100 by `scripts/record_memory_fixtures.py` with
the real `operator-profiler memory` CLI: a 111 M-parameter decoder's AdamW step (the targets: at least 95 % of the
bytes live at the peak attributed to a module, and the peak within 1 % of `torch.cuda.max_memory_allocated()` of
the same window run without the profiler), a workload that runs out of memory (the module, line and top three
holders named), and a small CNN's eager forward.

The archives are `tests/fixtures/h100_memory_{transformer_train,oom,cnn_eager}.tar.xz` (each holding its run
directory) and `h100_memory_measurements.json` (what the script measured beside them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_util import FIXTURES, extract_fixture

from mcp_server.memory.build import build_memory
from mcp_server.memory.text import oom_lines
from mcp_server.rundir import RunDir

MEASUREMENTS = FIXTURES / "h100_memory_measurements.json"
PARAMETERS = 111_008_256  # scripts/gpu_workloads/memory_transformer.py at full size
TENSORS = 12 * 12 + 5  # its parameter tensors: 12 per block, 12 blocks; two embeddings, the last norm's two, the head
# The caching allocator splits a large block only when more than 1 MiB would remain, so a block may exceed its request
# by up to 1 MiB: each state tensor's block (and each parameter's) holds its bytes plus at most that.
SLACK = 1 << 20
recorded = pytest.mark.skipif(not MEASUREMENTS.is_file(), reason="the H100 memory recordings are not here yet")


def _run(name: str, tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    return RunDir(extract_fixture(f"h100_memory_{name}", tmp_path_factory) / name)


def _measured(name: str) -> dict:
    return json.loads(MEASUREMENTS.read_text(encoding="utf-8"))[name]


def _replay_within_the_allocator_peaks(profile) -> None:
    """The replayed peak counts each request at the allocator's 512-byte granularity: at least the requested bytes'
    peak, at most the allocated (block sizes) peak."""
    assert profile.peak_requested_bytes is not None and profile.peak_allocated_bytes is not None
    assert 0.99 * profile.peak_requested_bytes <= profile.replayed_peak_bytes <= 1.01 * profile.peak_allocated_bytes


@recorded
def test_the_training_step_meets_both_targets(tmp_path_factory):
    profile = build_memory(_run("transformer_train", tmp_path_factory))
    measured = _measured("transformer_train")
    assert measured["exit_code"] == 0
    reference = measured["reference"]["max_memory_allocated"]
    assert profile.peak_allocated_bytes is not None
    assert abs(profile.peak_allocated_bytes - reference) <= 0.01 * reference
    peak = profile.at_peak
    assert peak is not None and peak.attributed_pct >= 95.0
    categories = {g.key: g.bytes for g in peak.by_category}
    assert 4 * PARAMETERS <= categories["parameter"] <= 4 * PARAMETERS + TENSORS * SLACK
    assert 8 * PARAMETERS <= categories["optimizer_state"] <= 8 * PARAMETERS + 2 * TENSORS * SLACK
    assert categories["activation"] == max(categories.values())
    assert profile.unmatched_frees == 0 and abs(profile.clock_offset_us) < 1000
    assert {s.phase for s in profile.phases} == {"forward", "backward", "optimizer"}
    assert "activation_checkpointing" in {f.pattern for f in profile.findings}
    _replay_within_the_allocator_peaks(profile)


@recorded
def test_the_out_of_memory_run_names_the_module_the_line_and_three_holders(tmp_path_factory):
    run_dir = _run("oom", tmp_path_factory)
    profile = build_memory(run_dir)
    oom = profile.oom
    assert oom is not None and oom.module is not None and oom.module.startswith("blocks.")
    assert oom.call_site is not None and "memory_oom.py:" in oom.call_site
    assert oom.held is not None and len(oom.held.holders) >= 3
    screen = oom_lines(profile, oom)
    measured = _measured("oom")
    assert measured["exit_code"] == 1 and "Traceback" not in measured["stderr"]
    assert screen[0] in measured["stderr"] and oom.module in measured["stderr"]


@recorded
def test_the_cnn_forward_holds_no_activations(tmp_path_factory):
    profile = build_memory(_run("cnn_eager", tmp_path_factory))
    peak = profile.at_peak
    assert peak is not None and profile.run_mode == "inference"
    categories = {g.key for g in peak.by_category}
    assert "activation" not in categories and {"parameter", "buffer"} <= categories
    _replay_within_the_allocator_peaks(profile)


def test_the_recording_script_writes_the_files_these_tests_read():
    script = (Path(__file__).resolve().parents[1] / "scripts" / "record_memory_fixtures.py").read_text("utf-8")
    assert '"transformer_train"' in script and '"oom"' in script and '"cnn_eager"' in script
    assert '{gpu}_memory_{run_dir.name}.tar.xz' in script and "{args.gpu}_memory_measurements.json" in script
