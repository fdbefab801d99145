"""A shape-variant pass that fails leaves the run standing: the main ncu pass's counters stand, each variant takes its
configuration's counters, and the profile says why. (On the H200, unet_small's optimized workload, which turns on
cuDNN's autotuner, made a variant pass in which ncu profiled nothing and wrote no report: the run ended with "ncu
wrote no report".) And the main pass's mismatch with the timeline names cuDNN's autotuner when it was on: each process
picks its own convolution kernels."""

from __future__ import annotations

import json
import shutil
import stat

from fixtures_util import extract_fixture, resnet50_nsys

from mcp_server.assemble.nsys import AUTOTUNED
from mcp_server.backends.registry import assemble
from mcp_server.capture.budget import within_budget
from mcp_server.capture.replay_plan import plan_replays
from mcp_server.capture.request import CaptureRequest, WorkloadOptions
from mcp_server.capture.variants import ncu_variants_pass
from mcp_server.rundir import RunDir
from mcp_server.schema.requests import NcuOptions
from mcp_server.schema.types import VARIANT_PASS


def test_a_variant_pass_without_its_report_is_left_out_and_said(tmp_path, tmp_path_factory):
    run = tmp_path / "decode_loop"
    shutil.copytree(extract_fixture("h200_decode_loop", tmp_path_factory) / "decode_loop", run)
    manifest = json.loads((run / "manifest.json").read_text())
    variants = next(p for p in manifest["passes"] if p["name"] == VARIANT_PASS)
    variants["notes"].append("the shape-variant pass failed (ncu wrote no report): its launches take their "
                             "configuration's counters")
    (run / "manifest.json").write_text(json.dumps(manifest))
    RunDir(run).ncu_report(VARIANT_PASS).unlink()
    profile = assemble(RunDir(run))
    assert any(w.startswith("the shape-variant pass failed (ncu wrote no report)") for w in profile.warnings)
    kernels = [k for op in profile.operators for k in op.kernels]
    assert all(k.metrics for k in kernels), "every launch keeps counters: its configuration's"
    assert any(k.propagated_from is not None for k in kernels)


def test_a_variant_pass_in_which_ncu_profiled_nothing_does_not_end_the_run(tmp_path, monkeypatch):
    ncu = tmp_path / "ncu"  # an ncu that profiles nothing, as the real one does when no kernel matches its filter
    ncu.write_text("#!/bin/sh\necho '==WARNING== No kernels were profiled.'\nexit 0\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("NCU", str(ncu))
    plan = within_budget(plan_replays(resnet50_nsys(tmp_path)), 600.0, 0.3)
    assert plan.variants
    workload = tmp_path / "w.py"
    workload.write_text("")
    req = CaptureRequest(workload=workload, run_dir=RunDir(tmp_path / "run"), options=WorkloadOptions(),
                         timeout_s=60)
    said: list[str] = []
    record = ncu_variants_pass(req, NcuOptions(replay_budget_s=600.0), said.append, plan=plan)
    assert any("the shape-variant pass failed" in line for line in said), said
    assert record is not None and record.name == VARIANT_PASS, "the manifest keeps the pass, with why it failed"
    assert record.notes[-1].startswith("the shape-variant pass failed")



def _with_other_kernels(tmp_path, tmp_path_factory, benchmark: bool | None):
    """conv_block's eager timeline joined with the ncu report of another process that ran other kernels (the
    Inductor run's), as a process whose cuDNN autotuner picked other convolutions gives; the nsys pass's
    harness.json says whether the autotuner was on."""
    run = tmp_path / "conv_block_eager"
    shutil.copytree(extract_fixture("h200_conv_block_eager", tmp_path_factory) / "conv_block_eager", run)
    other = extract_fixture("h200_conv_block_inductor", tmp_path_factory) / "conv_block_inductor"
    shutil.copy(other / "ncu" / "report.ncu-rep", RunDir(run).ncu_report("ncu"))
    harness = run / "nsys" / "harness.json"
    data = json.loads(harness.read_text())
    data["cudnn_benchmark"] = benchmark
    harness.write_text(json.dumps(data))
    return assemble(RunDir(run))


def test_a_mismatch_under_cudnns_autotuner_names_it(tmp_path, tmp_path_factory):
    profile = _with_other_kernels(tmp_path, tmp_path_factory, True)
    assert any(w.startswith("nsys/ncu mismatch") for w in profile.warnings)
    assert AUTOTUNED in profile.warnings


def test_a_mismatch_without_the_autotuner_does_not_blame_it(tmp_path, tmp_path_factory):
    profile = _with_other_kernels(tmp_path, tmp_path_factory, None)
    assert any(w.startswith("nsys/ncu mismatch") for w in profile.warnings)
    assert AUTOTUNED not in profile.warnings
