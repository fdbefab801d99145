"""A model run as an FX GraphModule (`torch.export`'s `.module()`, `torch.fx.symbolic_trace`) calls its operators from
generated code: no submodule's forward runs. Its operators take the module and the line each node came from."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conftest import REPO

from mcp_server.schema.io import load_profile

SCRIPT = REPO / "tests" / "scripts" / "exported_serve.py"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


def _line(text: str, path: Path = SCRIPT) -> str:
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{path}:{number}"


def _calls(out: Path) -> Counter[tuple[str | None, str, str | None]]:
    return Counter((op.module_path, op.operator_name, op.call_site)
                   for op in load_profile(out / "profile.json").operators)


def test_an_exported_programs_operators_take_their_modules_and_lines(tmp_path):
    """`torch.export` keeps each node's module and the user's line: the profile names them, not the program's
    caller, and the model by its own class."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPT), "--window-fn", "serve", "--steps", "1:1", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    block, net = _line("h = self.proj(self.norm(x))"), _line("return self.head(self.blocks(x)")
    expected = {("Net", "aten::mean", net): 1, ("head", "aten::linear", net): 1}
    for i in (0, 1):
        expected |= {(f"blocks.{i}.norm", "aten::layer_norm", block): 1, (f"blocks.{i}.proj", "aten::linear", block): 1,
                     (f"blocks.{i}", "aten::relu", _line("return x + torch.relu(h)")): 1,
                     (f"blocks.{i}", "aten::add", _line("return x + torch.relu(h)")): 1}
    calls = _calls(out)
    assert {key: n for key, n in calls.items() if key[0] is not None} == expected
    assert load_profile(out / "profile.json").capture_metadata.root_module == "Net"
    harness = json.loads((out / "torch" / "harness.json").read_text())
    assert harness["modules"]["blocks"] == "Sequential"  # the class traced, not export's bare container


def test_a_symbolically_traced_models_operators_take_their_modules(tmp_path):
    """symbolic_trace keeps each node's module but no stack: the modules are named, the lines are the caller's; the
    model traced is no root of its own (its GraphModule, of the same class name, is the one called)."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--script", str(SCRIPT), "--window-fn", "serve", "--steps", "1:1", "-o", str(out), "-q",
                   "--", "--trace", "fx")
    assert proc.returncode == 0, proc.stderr
    caller = _line("return program(batch).argmax")
    modules = Counter((path, name) for path, name, site in _calls(out) if path is not None and site == caller)
    assert modules == {("Net", "aten::mean"): 1, ("head", "aten::linear"): 1,
                       **{(f"blocks.{i}", name): 1 for i in (0, 1) for name in ("aten::relu", "aten::add")},
                       **{(f"blocks.{i}.norm", "aten::layer_norm"): 1 for i in (0, 1)},
                       **{(f"blocks.{i}.proj", "aten::linear"): 1 for i in (0, 1)}}


CONTRACT = """
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 16), nn.GELU())
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.inner(x) * 2)


def get_model_and_input():
    model, x = Encoder().eval(), torch.randn(3, 8)
    return torch.export.export(model, (x,)).module(), x
"""


def test_a_contract_workload_that_returns_an_exported_program(tmp_path):
    """The workload contract's module ranges name the program's nodes as script mode's do."""
    workload, out = tmp_path / "exported.py", tmp_path / "run"
    workload.write_text(CONTRACT)
    proc = run_cli("profile", str(workload), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    profile = load_profile(out / "profile.json")
    assert profile.capture_metadata.root_module == "Encoder"
    line = _line("return self.out(self.inner(x) * 2)", workload)
    named = Counter((op.module_path, op.operator_name, op.call_site) for op in profile.operators)
    assert named == {("inner.0", "aten::linear", line): 1, ("inner.1", "aten::gelu", line): 1,
                     ("Encoder", "aten::mul", line): 1, ("out", "aten::linear", line): 1}
