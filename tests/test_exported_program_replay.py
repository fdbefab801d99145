"""A model served as `torch.export` hands it over, and two more H200 profiles of kinds the checks had not met.

`h200_exported_serve.tar.xz`: scripts/gpu_workloads/exported_serve.py as it is (`run --script --window-fn serve
--steps 2:2 -- --batches 24`: a text encoder of four transformer blocks run as `torch.export.export(...).module()`,
an FX GraphModule whose generated code calls the aten operators itself, so no submodule's forward runs), its nsys and
timing passes, recorded by `scripts/record_real_workloads.py --cases exported_serve` on 2026-11-30. Before: every
kernel was the program's (`GraphModule`) at the line that called it; a first recording with the nodes' modules as
`module:` ranges sent the shape-variant replay after module calls that never happen (ncu wrote no report).
`h200_vocoder_ema_train.profile.json.xz`: scripts/gpu_workloads/vocoder_ema_train.py (`--steps 3:2`: a generator whose
convolutions are under `parametrizations.weight_norm`, an STFT loss, clipping, AdamW and a moving average of the
weights by `AveragedModel`). `h200_graph_breaks_compiled.profile.json.xz`: scripts/gpu_workloads/graph_breaks.py
compiled by Inductor (the workload contract), its forward broken by an `.item()` and a `print`.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import extract_fixture, recorded_profile

from mcp_server.backends.registry import assemble
from mcp_server.capture.replay_plan import plan_replays
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import OperatorAttributedProfile

SERVE = REPO / "scripts" / "gpu_workloads" / "exported_serve.py"
PROJECTIONS = ("attention.qkv", "attention.out", "mlp.0", "mlp.2")


def _line(text: str, path: Path = SERVE) -> str:
    """`exported_serve.py:<n>` of the line holding `text` (the recording ran from another checkout)."""
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path.name}:{number}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_fixture("h200_exported_serve", tmp_path_factory) / "exported_serve"


@pytest.fixture(scope="module")
def profile(served: Path) -> OperatorAttributedProfile:
    return assemble(RunDir(served))


def test_every_kernel_of_the_program_takes_the_module_and_the_line_its_node_came_from(
        profile: OperatorAttributedProfile) -> None:
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.capture_metadata.root_module == "TextEncoder"
    linears = Counter((op.module_path, (op.call_site or "").rsplit("/", 1)[-1]) for op in profile.operators
                      if op.operator_name == "aten::linear" and op.kernels)
    lines = {"attention.qkv": _line("q, k, v = self.qkv(x)"), "attention.out": _line("return self.out(attended"),
             "mlp.0": _line("return x + self.mlp("), "mlp.2": _line("return x + self.mlp(")}
    expected = {(f"blocks.{b}.{name}", lines[name]): 2 for b in range(4) for name in PROJECTIONS}
    assert linears == {**expected, ("classify", _line("return self.classify(")): 2}  # two steps
    caller = _line("return program(requests)")
    at_caller = sum(k.duration_ns for op in profile.operators if (op.call_site or "").endswith(caller)
                    for k in op.kernels)
    assert at_caller < 0.01 * profile.window.kernel_time_ns  # the read-back of the answers alone


def test_the_nodes_ranges_are_in_the_recording_and_no_call_of_a_module(served: Path) -> None:
    """Read with plain sqlite: the nodes' ranges are `node:` ranges, and a shape-variant replay chooses among the
    calls of modules that ran (the program's own), not among the nodes'."""
    with sqlite3.connect(served / "nsys" / "report.sqlite") as db:
        texts = [row[0] for row in db.execute("SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN "
                                              "StringIds s ON e.textId = s.id")]
    nodes = Counter(t.removeprefix("node:") for t in texts if t and t.startswith("node:"))
    modules = Counter(t.removeprefix("module:") for t in texts if t and t.startswith("module:"))
    assert {f"blocks.{b}.{name}" for b in range(4) for name in PROJECTIONS} <= set(nodes)
    assert set(modules) == {"TextEncoder", "_guards_fn"}  # the program and its input checks: no model submodule
    plan = plan_replays(served / "nsys" / "report.sqlite")
    assert plan.variants and plan.calls and {path for path, _ in plan.calls} == {"TextEncoder"}


def test_a_weight_normed_vocoders_moving_average_and_clipping_are_its_update(tmp_path: Path) -> None:
    profile = recorded_profile("h200_vocoder_ema_train", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    phases = Counter((op.phase, op.operator_name) for op in profile.operators if op.kernels)
    for name in ("aten::_foreach_lerp_", "aten::_foreach_norm"):  # the average's update, the clipping
        assert phases[("optimizer", name)] > 0 and phases[("forward", name)] == 0, name
    norms = {op.module_path for op in profile.operators if op.operator_name == "aten::_weight_norm" and op.kernels}
    assert norms and all(path and path.split(".")[0] in ("pre", "ups", "blocks", "post") for path in norms)
    convolutions = [op for op in profile.operators if op.operator_name in ("aten::conv1d", "aten::conv_transpose1d")
                    and op.kernels]
    assert convolutions and all(op.module_path and op.phase == "forward" for op in convolutions)
    assert {op.operator_name for op in profile.operators if op.kernels and op.module_path is None
            and op.phase == "forward"} >= {"aten::stft", "aten::l1_loss"}  # the loss is outside the model


def test_a_compiled_forward_broken_twice_keeps_its_modules(tmp_path: Path) -> None:
    profile = recorded_profile("h200_graph_breaks_compiled", tmp_path)
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.window.module_path_kernel_time_pct == 100.0
    products = Counter(op.module_path for op in profile.operators if op.operator_name == "aten::mm")
    assert products == {"first.0": 1, "second.0": 1, "third.0": 1}
    assert len({op.compiled_graph for op in profile.operators if op.compiled_graph}) == 3  # three graphs
