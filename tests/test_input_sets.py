"""The input sets a measurement rotates among and validate's second call: perturbed copies that keep an input's
structure, and the workload's own inputs where a perturbation makes the model raise."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mcp_server.children.common import perturb, varied_inputs
from mcp_server.proof.recipes import recipes
from mcp_server.schema.requests import RecipeTiming

WORKLOADS = Path(__file__).resolve().parent / "workloads"
FAST = RecipeTiming(warmup=2, calls=12, queued=12, blocks=2, budget_s=0.2, input_sets=3)


def test_ordered_integer_inputs_are_kept_and_others_permuted():
    offsets = torch.tensor([[0, 3, 3, 9], [0, 1, 5, 6]])
    lengths = torch.tensor([7, 5, 5, 2])  # sorted for pack_padded_sequence
    ids = torch.tensor([[5, 2, 9, 4, 7], [1, 8, 3, 6, 0]])
    varied = perturb((ids, offsets, lengths), seed=3)
    assert torch.equal(varied[1], offsets) and torch.equal(varied[2], lengths)
    assert not torch.equal(varied[0], ids) and sorted(varied[0].flatten().tolist()) == sorted(ids.flatten().tolist())


def test_a_perturbation_the_model_refuses_leaves_its_own_inputs_and_says_why():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_bag", WORKLOADS / "tiny_bag.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, inputs = module.get_model_and_input()
    kept, why = varied_inputs(model, inputs, [1, 2])
    assert kept == [] and why is not None
    assert why.startswith("2 of 2 perturbed input sets made the model as written raise (ValueError: every sequence "
                          "must open with the BOS token)")
    bag_only = (inputs[0], inputs[1], inputs[2].clone())
    kept, why = varied_inputs(lambda i, o, t: model.bag(i, o), bag_only, [1, 2])
    assert why is None and len(kept) == 2 and torch.equal(kept[0][1], inputs[1])  # the offsets kept


def test_a_frontier_of_a_workload_with_structured_inputs_is_timed_on_its_own_inputs(tmp_path):
    """Before, every recipe failed at warm-up on permuted offsets ('offsets[0] has to be 0') and the frontier
    stopped at its reference."""
    report = recipes(WORKLOADS / "tiny_bag.py", python=sys.executable, options=FAST, seeds=(0,),
                     only=("eager+bf16-cast",), out_dir=tmp_path)
    reference = report.result("eager+fp32")
    assert reference is not None and reference.status == "ok"
    assert any("must open with the BOS token" in w for w in reference.warnings)
    cast = report.result("eager+bf16-cast")
    assert cast is not None and cast.status == "ok"


def test_validate_takes_the_same_inputs_again_when_the_model_refuses_a_perturbed_copy():
    """The second call of validate's pair is normally a perturbed copy (a result cached from the first is caught); a
    model that refuses it is called with its own inputs again, and the report says what that leaves unchecked."""
    from mcp_server.proof.validate import render_checks, validate

    report = validate(WORKLOADS / "tiny_bag.py", WORKLOADS / "tiny_bag_optimized.py", python=sys.executable,
                      seeds=(0, 1), run_tests=False)
    assert report.passed, render_checks(report)
    said = [w for w in report.warnings if "perturbed copy of the inputs" in w]
    assert len(said) == 1 and "ValueError: every sequence must open with the BOS token" in said[0]
    assert said[0].endswith("so a cached result is not detected")
