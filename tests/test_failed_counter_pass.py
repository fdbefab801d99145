"""ncu stops the whole process when it cannot replay one kernel (on two H200s, the gather of an `nn.DataParallel`
training step, reading another GPU's memory: "==ERROR== UnknownError ... Failed to profile
CatArrayBatchedCopy_vectorized", exit code 9). The run then keeps what the other passes measured: the profile is
assembled without counters and says why. Replayed from real recordings: `h200_mlp_activations_inductor.tar.xz` with
its ncu report removed, as the failed pass leaves its run directory, and `h200_dataparallel_train.tar.xz`
(scripts/gpu_workloads/dataparallel_train.py as it is, `run --script --steps 3:1` on two H200s, recorded by
`scripts/record_real_workloads.py --cases dataparallel_train` on 2026-11-30: its nsys and timing passes; the ncu pass
failed as above, and the run finished with the warning)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from fixtures_util import extract_fixture

from mcp_server.backends.registry import assemble
from mcp_server.capture.schedule import counters_failed
from mcp_server.errors import CaptureFailed
from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import RunManifest
from mcp_server.schema.types import COUNTER_PASS

FAILED = ("the ncu pass's process exited with code 9 before the harness wrote its result (last lines: ==ERROR== "
          "UnknownError | ==ERROR== Failed to profile \"CatArrayBatchedCopy_vectorized\" in process 916)")


def test_a_failed_counter_pass_leaves_a_profile_without_counters_that_says_why(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    recorded = extract_fixture("h200_mlp_activations_inductor", tmp_path_factory) / "mlp_activations_inductor"
    full = assemble(RunDir(recorded))
    run = shutil.copytree(recorded, tmp_path / "run")
    manifest = RunManifest.model_validate_json((run / "manifest.json").read_text())
    record = manifest.pass_named(COUNTER_PASS)
    assert record is not None and (run / "ncu" / "report.ncu-rep").is_file()
    exc = CaptureFailed(FAILED, "read ncu/output.log")
    exc.records = [record]
    kept = counters_failed(exc, lambda line: None)  # what the run keeps of the pass
    assert kept == [record] and record.notes[-1].startswith("the ncu pass failed (")
    (run / "manifest.json").write_text(manifest.model_dump_json(indent=1))
    (run / "ncu" / "report.ncu-rep").unlink()

    profile = assemble(RunDir(run))
    assert full.capture_metadata.tool == "nsys+ncu" and profile.capture_metadata.tool == "nsys"
    assert not any(k.metrics for op in profile.operators for k in op.kernels)
    assert any(k.metrics for op in full.operators for k in op.kernels)
    assert profile.window.kernel_count == full.window.kernel_count
    assert profile.window.attributed_kernel_time_pct == full.window.attributed_kernel_time_pct
    assert any(w.startswith("the ncu pass failed (") and "CatArrayBatchedCopy" in w for w in profile.warnings)


def test_a_dataparallel_steps_replicas_add_up_under_the_model_they_copy(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    run = extract_fixture("h200_dataparallel_train", tmp_path_factory) / "dataparallel_train"
    profile = assemble(RunDir(run))
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.capture_metadata.root_module == "DataParallel"
    convolutions = Counter((k.device_id, op.module_path, op.phase) for op in profile.operators for k in op.kernels
                           if op.operator_name == "aten::conv2d" or op.operator_name == "aten::cudnn_convolution")
    # each GPU's replica ran the first convolution under the path of the module it copies
    assert {(device, path) for device, path, _ in convolutions if path == "module.features.0"} == {
        (0, "module.features.0"), (1, "module.features.0")}
    roots = {(op.module_path or "").split(".")[0] for op in profile.operators if op.kernels}
    assert roots <= {"", "module", "DataParallel"}  # no replica a model of its own
    harness = json.loads((run / "nsys" / "harness.json").read_text())
    assert not any(path.startswith("Net") for path in harness["modules"])
