"""ncu stops the whole process when it cannot replay one kernel (on two H200s, an `nn.DataParallel` training step
whose NCCL buffers ncu could not save and restore: "==ERROR== UnknownError ... Failed to profile
CatArrayBatchedCopy_vectorized", exit code 9; `tests/test_collectives_in_one_process.py` has its mend). The run then
keeps what the other passes measured: the profile is assembled without counters and says why. Replayed from a real
recording, `h200_mlp_activations_inductor.tar.xz`, with its ncu report removed, as the failed pass leaves its run
directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fixtures_util import extract_fixture

from mcp_server.analysis import analyze_profile
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
    # the analysis says how to get the counters the nsys run lacks: not another backend, a replay of its kernels
    analysis = analyze_profile(profile, tmp_path / "analysis", measure=False)
    said = [n for n in analysis.notes if n.startswith("kernels carry no hardware counters (nsys)")]
    assert len(said) == 1 and "operator-profiler map RUN_DIR" in said[0] and "--backend" not in said[0]
