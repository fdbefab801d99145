"""A model split across the two GPUs of one process, and user code autograd runs on its device thread, replayed from
H200 recordings made by `scripts/record_real_workloads.py` on 2026-11-30 (their nsys and timing passes).

`h200_two_gpu_pipeline.tar.xz`: scripts/gpu_workloads/two_gpu_pipeline.py as it is (`run --script --steps 3:1`, on
two H200s: the embeddings and the first four blocks on `cuda:0`, the rest and the head on `cuda:1`, the activations
copied between them). `h200_reentrant_checkpoint_small.tar.xz`: tests/scripts/checkpoint_train.py `--reentrant`
(`use_reentrant=True`: the checkpoint's node runs the blocks' forward again on autograd's device thread, where no
torch function mode of the caller's is on; recorded once a call-site mode was entered around a custom Function's
backward there). Before, that recomputation had no line on a GPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile, format_summary
from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

PIPELINE = REPO / "scripts" / "gpu_workloads" / "two_gpu_pipeline.py"
CHECKPOINT = REPO / "tests" / "scripts" / "checkpoint_train.py"


def _line(path: Path, text: str) -> str:
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path.name}:{number}"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> OperatorAttributedProfile:
    return assemble(RunDir(extract_fixture("h200_two_gpu_pipeline", tmp_path_factory) / "two_gpu_pipeline"))


def test_each_half_of_a_split_model_runs_on_its_own_gpu(pipeline: OperatorAttributedProfile) -> None:
    assert pipeline.window.attributed_kernel_time_pct == 100.0
    devices = Counter((k.device_id, (op.module_path or "").split(".")[0]) for op in pipeline.operators
                      for k in op.kernels if op.phase in ("forward", "backward"))
    assert {part for device, part in devices if device == 0} == {"lower", "embed"}
    assert {part for device, part in devices if device == 1} >= {"upper", "norm", "head"}
    # the update steps both halves' parameters, on both GPUs, as the model's
    update = {k.device_id for op in pipeline.operators if op.phase == "optimizer" for k in op.kernels}
    assert update == {0, 1}
    assert {op.module_path for op in pipeline.operators if op.phase == "optimizer" and op.kernels} == {"SplitLM"}


def test_the_activations_crossing_between_the_gpus_are_named_copies(pipeline: OperatorAttributedProfile) -> None:
    crossing = [e for e in pipeline.runtime_events or [] if e.kind == "memcpy" and e.copy_kind == "PtoP"]
    assert len(crossing) == 2  # the forward's activations, the backward's gradient
    assert {(e.module_path, (e.call_site or "").rsplit("/", 1)[-1]) for e in crossing} == {
        ("SplitLM", _line(PIPELINE, "hidden.to(self.second)"))}
    assert all(e.bytes == 8 * 512 * 1024 * 4 for e in crossing)  # batch x tokens x width, float32


def test_the_timeline_says_the_gpus_take_turns(pipeline: OperatorAttributedProfile, tmp_path: Path) -> None:
    analysis = analyze_profile(pipeline, out_dir=tmp_path, measure=False)
    timeline = analysis.timeline
    assert timeline is not None
    assert [(d.device_id, d.kernel_count) for d in timeline.devices] == [(0, 286), (1, 282)]
    assert {s.device_id for s in timeline.streams} == {0, 1}
    assert timeline.device_overlap_ns < 0.1 * min(d.busy_ns for d in timeline.devices)
    assert any("the GPUs take turns" in note for note in timeline.notes)
    assert "GPUs: 0 busy 6.224 ms = 28.5 %, 1 busy 8.967 ms = 41.1 %" in format_summary(analysis)
    # the GPUs could run at once: the window's floor is the busiest one's (no counters here: its kernels at their
    # measured times, and a launch each), not the two added together
    second = [k for op in pipeline.operators for k in op.kernels if k.device_id == 1]
    assert analysis.speed_of_light is not None
    assert analysis.speed_of_light.floor_ns == sum(k.duration_ns for k in second) + len(second) * 1000


def test_reentrant_checkpointings_recomputation_on_autograds_thread_takes_the_blocks_lines(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    run = extract_fixture("h200_reentrant_checkpoint_small", tmp_path_factory) / "reentrant_checkpoint_small"
    profile = assemble(RunDir(run))
    again = [op for op in profile.operators if op.recomputed]
    sites = Counter((op.module_path, (op.call_site or "").rsplit("/", 1)[-1]) for op in again)
    norm, ff = _line(CHECKPOINT, "# NORM_LINE"), _line(CHECKPOINT, "# FF_LINE")
    expected = Counter()
    for block in (1, 2):  # the first block is not checkpointed
        expected.update({(f"blocks.{block}.norm", norm): 1, (f"blocks.{block}.ff.0", ff): 1,
                         (f"blocks.{block}.ff.1", ff): 1, (f"blocks.{block}.ff.2", ff): 1, (f"blocks.{block}", ff): 1})
    assert sites == expected
