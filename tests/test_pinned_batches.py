"""DataLoader batches left pageable in the ncu passes: ncu restores pinned host memory before each replay pass of every
kernel (on the H200 a training script's DataLoader with `pin_memory=True` made each replayed kernel cost 0.61 s
instead of 0.39 s), so the counter passes hand each batch over as it is, and say so; the timeline's pass keeps the
workload's pinning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils import pin_memory as pinning

from mcp_server.capture.passes import kept_report, pageable_note
from mcp_server.capture.request import CaptureRequest, harness_command
from mcp_server.children.contract import BATCHES_ASKED, OFFLOAD_ASKED, PAGEABLE_LINE
from mcp_server.children.pinned import PageableBatches, pinned_host_bytes
from mcp_server.process import child_script
from mcp_server.rundir import RunDir
from mcp_server.schema.harness import HarnessResult
from mcp_server.schema.manifest import PassRecord

TRAIN = REPO / "tests" / "scripts" / "plain_train.py"


def test_a_loader_that_pins_hands_over_its_batches_as_they_are(capsys):
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, pin_memory=True)
    original = pinning.pin_memory
    batches = PageableBatches().install()
    try:
        it = iter(loader)
        it._pin_memory = True  # as on a machine with CUDA: the loader pins each batch it yields
        first, second = next(it), next(it)
    finally:
        batches.remove()
    assert torch.equal(first[0], torch.tensor([0.0, 1.0])) and torch.equal(second[0], torch.tensor([2.0, 3.0]))
    assert batches.batches == 2
    assert capsys.readouterr().out.count(PAGEABLE_LINE) == 1, "said once, by the first batch"
    assert pinning.pin_memory is original, "removed: the loaders pin again"
    if not torch.cuda.is_available():
        assert pinned_host_bytes() is None
        it = iter(loader)
        it._pin_memory = True
        with pytest.raises(RuntimeError):  # pinning for real needs an accelerator: the patch is what held above
            next(it)


def test_only_the_counter_passes_ask_the_harness_for_pageable_batches(tmp_path):
    req = CaptureRequest(workload=TRAIN, run_dir=RunDir(tmp_path / "run"))
    assert "--pageable-batches" not in harness_command(req, "nvtx", "nsys")
    assert "--pageable-batches" in harness_command(req.with_turn(pageable_batches=True), "nvtx", "ncu")


def test_the_harness_counts_the_batches_it_left_pageable(tmp_path):
    """The real harness running a DataLoader script with the flag: harness.json counts the batches it left pageable
    (none here: without CUDA the loader never pins) and the loader works as it did."""
    result = tmp_path / "harness.json"
    proc = subprocess.run(
        [sys.executable, str(child_script("harness")), "--workload", str(TRAIN), "--run-dir", str(tmp_path),
         "--result", str(result), "--profiler", "none", "--warmup-iters", "1", "--iters", "1", "--run-script",
         "--pageable-batches", "--script-arg=--epochs", "--script-arg=2"],
        capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    harness = json.loads(result.read_text())
    assert harness["status"] == "ok" and harness["pageable_batches"] == 0


def _record() -> PassRecord:
    return PassRecord(name="ncu", profiler="nvtx", command=[], directory="ncu", started_at="2026-11-28T00:00:00+00:00",
                      wall_time_s=1.0, exit_code=0)


def test_an_ncu_pass_whose_batches_were_left_pageable_says_so(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.pass_dir("ncu").mkdir(parents=True)
    run_dir.ncu_report("ncu").write_bytes(b"")
    req = CaptureRequest(workload=TRAIN, run_dir=run_dir)
    quiet_record = kept_report(_record(), req, print)
    assert not any("pageable" in n for n in quiet_record.notes), "no log line: no DataLoader pinned anything"
    run_dir.output_log("ncu").write_text(f"step 0\n{PAGEABLE_LINE}{BATCHES_ASKED}\n")
    record = kept_report(_record(), req, print)
    assert record.artifacts == ["ncu/report.ncu-rep"]
    assert [n for n in record.notes if "pageable" in n] == [
        "the workload's DataLoader batches were left pageable in this pass (ncu restores pinned host memory before "
        "each replay pass of every kernel: about 1.4 ms per MiB on an H200); the timeline's pass kept them pinned"]
    both = pageable_note(f"{PAGEABLE_LINE}{OFFLOAD_ASKED}\nstep 1\n{PAGEABLE_LINE}{BATCHES_ASKED}\n")
    assert both is not None and both.startswith(
        "the workload's DataLoader batches and activations offloaded by save_on_cpu were left pageable")


def test_activations_offloaded_to_the_host_are_left_pageable_too(capsys):
    """`save_on_cpu(pin_memory=True)` keeps a step's saved activations pinned (hundreds of MiB on a GPU): in the counter
    passes each context offloads them to pageable memory; the model trains as it did."""
    from torch.autograd.graph import save_on_cpu

    original = save_on_cpu.__init__
    offloads = PageableBatches().install()
    try:
        model, x = torch.nn.Linear(4, 4), torch.randn(3, 4, requires_grad=True)
        for hooks in (save_on_cpu(pin_memory=True), save_on_cpu(True)):  # asked by keyword, or positionally
            with hooks:
                loss = model(x).square().sum()
            loss.backward()
        with save_on_cpu():  # not asking to pin: not counted
            model(x).sum().backward()
    finally:
        offloads.remove()
    assert offloads.offloads == 2 and x.grad is not None and model.weight.grad is not None
    assert capsys.readouterr().out.count(PAGEABLE_LINE + OFFLOAD_ASKED) == 1, "said once"
    assert save_on_cpu.__init__ is original


def test_an_ncu_pass_whose_workload_pinned_memory_itself_says_what_it_cost(tmp_path):
    """The workload's own pinned buffers (not a DataLoader's) stay pinned under ncu: the pass's notes say how many MiB
    its window held and what they cost each replayed kernel; a few MiB say nothing."""
    run_dir = RunDir(tmp_path / "run")
    run_dir.pass_dir("ncu").mkdir(parents=True)
    run_dir.ncu_report("ncu").write_bytes(b"")
    req = CaptureRequest(workload=TRAIN, run_dir=run_dir)
    harness = HarnessResult.model_validate({"status": "ok", "window": {"wall_time_ns": 1,
                                                                        "pinned_host_bytes": 300 * 2**20}})
    said: list[str] = []
    record = kept_report(_record(), req, said.append, harness)
    assert any(n.startswith("the workload held 300 MiB of pinned host memory") and "0.42 s" in n for n in record.notes)
    assert any("300 MiB" in line for line in said)
    harness.the_window.pinned_host_bytes = 4 * 2**20
    assert not any("pinned host memory as the window began" in n
                   for n in kept_report(_record(), req, print, harness).notes)
    assert not any("pinned host memory as the window began" in n for n in kept_report(_record(), req, print).notes)
