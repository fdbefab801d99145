"""The optimized workload's structure is described once: docs/optimized-workload-contract.md.

The skeleton, the rules and the test template live in that document; the implement skill, the backend-engineer
agent, the backend recipe and the implementation brief's template name it instead of restating it. The skeleton
and the test template are checked as code: they compile, define what validate and the PostToolUse hook look
for, and, with `NAME` set to the tiny MLP and one real pass in the pass slot, pass the engine's validate on the
CPU.
"""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import REPO

from mcp_server.proof.validate import validate
from mcp_server.schema.optimizations import OptimizationPlan

CONTRACT_PATH = "docs/optimized-workload-contract.md"
CONTRACT = REPO / CONTRACT_PATH
# The texts that point to the contract instead of restating it; the plugin's own texts reach it at run time
# through the plugin root.
POINTERS = {
    "skills/implement/SKILL.md": True,
    "agents/backend-engineer.md": True,
    "skills/implement/references/backend-recipe.md": True,
    "prompts/implementation.md.j2": False,
}
# Lines that only a copy of the skeleton or of the test template would contain.
SKELETON_LINES = (
    "@torch._dynamo.register_backend(name=BACKEND_NAME)",
    "APPLIED_PASSES: dict[str, int]",
    "def optimize(model: torch.nn.Module)",
    "compile_fx(gm, example_inputs, config_patches=patches)",
    "return clone_outputs(compiled)",
    "def test_matches_baseline_and_applies_its_passes",
    "model.load_state_dict(base_model.state_dict())",
)
# The skeleton's slots the implementation brief sends each item to.
SLOTS = ("FX_PASSES", "INDUCTOR_OPTIONS", "clone_outputs", "patches", "optimize(")
WORKLOADS = REPO / "tests" / "workloads"
PASS_STUB = "\n    ...\n"
NO_OPTIONS = "INDUCTOR_OPTIONS: dict[str, dict[str, Any]] = {}"


def _code(heading: str) -> str:
    """The first python block after `heading` in the contract."""
    text = CONTRACT.read_text(encoding="utf-8")
    assert f"\n{heading}\n" in text, f"the contract has no section {heading!r}"
    return text.split(f"\n{heading}\n", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


def skeleton() -> str:
    return _code("## The skeleton")


def generated_test() -> str:
    return _code("## The generated test, `test_NAME_optimized.py`")


def _named(code: str, name: str) -> str:
    """The code with its placeholder module name `NAME` (not the `_NAME` of BACKEND_NAME) set to `name`."""
    return re.sub(r"(?<!\w)NAME", name, code)


def test_the_structure_is_described_in_the_contract_and_nowhere_else() -> None:
    contract = CONTRACT.read_text(encoding="utf-8")
    for line in SKELETON_LINES:
        assert line in contract, f"the contract lost {line!r}"
    for path, plugin_text in POINTERS.items():
        text = (REPO / path).read_text(encoding="utf-8")
        copied = [line for line in SKELETON_LINES if line in text]
        assert not copied, f"{path} restates the contract's skeleton: {copied}"
        assert "```python" not in text, f"{path} carries code of its own: the skeleton is the contract's"
        assert CONTRACT_PATH in text, f"{path} does not name {CONTRACT_PATH}"
        if plugin_text:
            assert f"${{CLAUDE_PLUGIN_ROOT}}/{CONTRACT_PATH}" in text, f"{path} must reach the contract at run time"


def test_the_slots_the_brief_names_are_the_skeletons() -> None:
    brief, code = (REPO / "prompts" / "implementation.md.j2").read_text(encoding="utf-8"), skeleton()
    for slot in SLOTS:
        assert slot in brief and slot in code, slot


def test_the_skeleton_defines_what_validate_and_the_hook_look_for(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    code, test_code = skeleton(), generated_test()
    tree = ast.parse(compile(code, "NAME_optimized.py", "exec", ast.PyCF_ONLY_AST))
    compile(test_code, "test_NAME_optimized.py", "exec")
    assigned = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    assert isinstance(assigned["BACKEND_NAME"], ast.Constant) and isinstance(assigned["BACKEND_NAME"].value, str)
    annotated = {n.target.id: ast.unparse(n.annotation) for n in tree.body if isinstance(n, ast.AnnAssign)}
    assert annotated["APPLIED_PASSES"] == "dict[str, int]"
    imported = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("NAME", "get_model_and_input") in imported, "the baseline's builder is re-exported"
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    registered = [f for f in functions.values() for d in f.decorator_list
                  if ast.unparse(d) == "torch._dynamo.register_backend(name=BACKEND_NAME)"]
    assert len(registered) == 1, "one backend, registered under BACKEND_NAME at import time"
    returned = [ast.unparse(n.value) for n in ast.walk(functions["optimize"]) if isinstance(n, ast.Return)]
    assert returned == ["torch.compile(model, backend=BACKEND_NAME)"], "optimize() compiles with the name"
    assert "compile_fx" in ast.unparse(registered[0]) and "clone_outputs" in ast.unparse(registered[0])
    assert "optimized.optimize(model)" in test_code and "optimized.APPLIED_PASSES" in test_code
    pattern = ast.parse((REPO / "knowledge" / "fx_patterns" / "cuda_graphs.py").read_text(encoding="utf-8"))
    copied = next(n for n in pattern.body if isinstance(n, ast.FunctionDef) and n.name == "clone_outputs")
    assert ast.unparse(functions["clone_outputs"]) == ast.unparse(copied), "clone_outputs is the pattern's, as is"

    # the PostToolUse hook's contract names are all there
    monkeypatch.syspath_prepend(str(REPO / "hooks"))
    from nudges import on_optimized

    path = tmp_path / "tiny_mlp_optimized.py"
    path.write_text(_named(code, "tiny_mlp"), encoding="utf-8")
    said, error = on_optimized(path)
    assert not error and "follows the contract" in said


def _plan(workload: Path) -> OptimizationPlan:
    """Two implemented items, one per slot the filled skeleton uses."""
    item = {
        "id": "fold-something", "rank": 1, "title": "Fuse scale-and-shift into addcmul", "ir_level": "functional",
        "target": {"operator_name": "aten::mul"}, "evidence": [{"metric": "kernel_count", "value": 2}],
        "rationale": "two element-wise kernels become one.",
        "expected_gain": {"end_to_end_speedup_low": 1.0, "end_to_end_speedup_high": 1.1, "basis": "Amdahl"},
        "pattern": "knowledge/fx_patterns/conv_bn_fold.py", "pass_name": "fold_something", "status": "implemented",
    }
    graphs = {**item, "id": "cuda-graphs", "rank": 2, "title": "Replay as a CUDA graph",
              "ir_level": "inductor-config", "pattern": "knowledge/fx_patterns/cuda_graphs.py",
              "pass_name": "cuda_graphs"}
    return OptimizationPlan(workload=str(workload), baseline_profile="profile.json",
                            created_at="2026-01-01T00:00:00+00:00", items=[item, graphs])


@pytest.mark.slow
def test_the_filled_skeleton_and_its_test_pass_validate(tmp_path: Path) -> None:
    """NAME = tiny_mlp; the pass slot runs a real rewrite (mul + add -> addcmul), INDUCTOR_OPTIONS turns CUDA
    graphs on (ignored on the CPU, but the outputs go through clone_outputs); everything else is the contract's
    text as written, compiled by Inductor."""
    pytest.importorskip("torch")
    for name in ("tiny_mlp.py", "tiny_passes.py"):
        shutil.copy(WORKLOADS / name, tmp_path / name)
    code = _named(skeleton(), "tiny_mlp")
    assert code.count(PASS_STUB) == 1 and code.count(NO_OPTIONS) == 1
    code = code.replace(PASS_STUB, "\n    from tiny_passes import fuse_mul_add\n\n    return fuse_mul_add(gm)\n")
    code = code.replace(NO_OPTIONS, NO_OPTIONS[:-2] + '{"cuda_graphs": {"triton.cudagraphs": True}}')
    optimized = tmp_path / "tiny_mlp_optimized.py"
    optimized.write_text(code, encoding="utf-8")
    test_code = _named(generated_test(), "tiny_mlp")
    test_code += '    assert optimized.APPLIED_PASSES.get("cuda_graphs", 0) >= 1\n'
    (tmp_path / "test_tiny_mlp_optimized.py").write_text(test_code, encoding="utf-8")

    report = validate(tmp_path / "tiny_mlp.py", optimized, python=sys.executable, seeds=(0,), run_tests=True,
                      plan=_plan(tmp_path / "tiny_mlp.py"), timeout_s=900)
    statuses = {c.name: c.status for c in report.checks}
    details = {c.name: c.detail for c in report.checks if c.status != "pass"}
    assert report.passed, details
    assert {name for name, status in statuses.items() if status != "pass"} == {"speedup_plausible"}, details
    assert report.backend_name == "tiny_mlp_opt"
    assert report.applied_passes.get("fold_something", 0) >= 1 and report.applied_passes.get("cuda_graphs", 0) >= 1
