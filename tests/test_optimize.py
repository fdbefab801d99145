"""optimize, the floor in one command: the frontier's winner written as plain code, validated, benched, profiled and
reported, every file in the output folder; real runs of tiny workloads on the CPU."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from mcp_server import api
from mcp_server.children.numerics import loosens
from mcp_server.cli import main as cli
from mcp_server.proof.validate import validate
from mcp_server.render.recipe_workload import recipe_workload, write_recipe_workload
from mcp_server.schema.io import load_profile
from mcp_server.schema.recipes import RecipesReport, Winner
from mcp_server.schema.requests import (
    BenchRequest,
    Interpreter,
    OptimizeRequest,
    RecipesRequest,
    RecipeTiming,
)

WORKLOADS = Path(__file__).resolve().parent / "workloads"
FAST = RecipeTiming(warmup=2, calls=12, queued=12, blocks=1, budget_s=0.2, input_sets=1)
PYTHON = Interpreter(python=sys.executable)


@pytest.fixture(scope="module")
def frontier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real frontier of tiny_mlp on this CPU: fp32 eager and bf16 autocast, eagerly."""
    out = tmp_path_factory.mktemp("frontier")
    api.recipes(RecipesRequest(workload=WORKLOADS / "tiny_mlp.py", python=PYTHON, only=("eager+bf16-autocast",),
                               seeds=(0,), timing=FAST, output=out, project=out))
    return out / "recipes.json"


def _report(frontier: Path) -> RecipesReport:
    return RecipesReport.model_validate_json(frontier.read_text())


def test_a_cuda_graph_recipe_is_written_with_its_step_marks_and_copied_outputs(frontier: Path) -> None:
    report = _report(frontier).model_copy(update={"device_type": "cuda", "device_name": "NVIDIA H100 80GB HBM3"})
    winner = Winner(tier="reduced", metric="latency", recipe="reduce-overhead+fp16-cast+channels-last",
                    time_ns=1.754e6, speedup_vs_reference=8.16, max_rel_error=5.2e-4, code=[])
    source = recipe_workload(WORKLOADS / "tiny_mlp.py", winner, report, frontier)
    ast.parse(source)
    assert 'RECIPE = "reduce-overhead+fp16-cast+channels-last"' in source
    assert "model = model.to(torch.float16)" in source
    assert "model = model.to(memory_format=torch.channels_last)" in source
    assert 'compiled = torch.compile(model, mode="reduce-overhead")' in source
    assert "torch.compiler.cudagraph_mark_step_begin()" in source and "t.clone()" in source
    assert "torch.backends.cudnn.allow_tf32 = False" in source
    assert f"sys.path.insert(0, {str(WORKLOADS)!r})" in source
    # the inputs' cast and layout are converted once, before the calls, as recipes converted them: not in run()
    run_body = source.split("def run(")[1].split("return run")[0]
    assert "x.to(" not in run_body and "channels_last" not in run_body
    prepare = source.split("def prepare_inputs(")[1]
    assert "x.to(torch.float16)" in prepare and "memory_format=torch.channels_last" in prepare


def test_a_cast_recipe_s_inputs_are_converted_by_prepare_inputs_in_validate_and_bench(frontier: Path,
                                                                                       tmp_path: Path) -> None:
    """The whole model in bf16 rejects float32 inputs: validate and bench run it only by applying prepare_inputs."""
    report = _report(frontier)
    winner = Winner(tier="reduced", metric="latency", recipe="eager+bf16-cast", time_ns=1.0, code=[])
    optimized = write_recipe_workload(WORKLOADS / "tiny_mlp.py", winner, report, frontier, tmp_path)
    verdict = validate(WORKLOADS / "tiny_mlp.py", optimized, python=sys.executable, seeds=(0,), run_tests=False,
                       tier="reduced", out_dir=tmp_path)
    checks = {c.name: c.status for c in verdict.checks}
    assert checks["runs"] == "pass", verdict.checks
    assert verdict.max_rel_error is not None and verdict.max_rel_error < 0.05  # bf16's rounding, measured
    assert checks["input_mutation"] == checks["output_aliasing"] == "pass"
    result = api.bench(BenchRequest(baseline=WORKLOADS / "tiny_mlp.py", optimized=optimized, python=PYTHON,
                                    timing=FAST, output=tmp_path / "bench",
                                    project=tmp_path))
    assert result.speedup.point > 0 and result.optimized.how_run == "optimize()"


def _written_and_validated(frontier: Path, recipe: str, workload: Path, out: Path) -> tuple[Path, Any]:
    """`recipe` written as `workload`'s optimized workload (the tiny frontier's report for its facts), and validate's
    verdict on it in the fp8 tier, which ran."""
    winner = Winner(tier="reduced", metric="latency", recipe=recipe, time_ns=1.0, code=[])
    optimized = write_recipe_workload(workload, winner, _report(frontier), frontier, out)
    verdict = validate(workload, optimized, python=sys.executable, seeds=(0,), run_tests=False, tier="fp8",
                       out_dir=out)
    assert {c.name: c.status for c in verdict.checks}["runs"] == "pass", verdict.checks
    return optimized, verdict


def test_a_cast_recipe_s_workload_converts_inputs_nested_in_lists_and_dicts(frontier: Path, tmp_path: Path) -> None:
    """recipes casts every tensor of the inputs, however nested: the written prepare_inputs does too (it converted
    only the top level, and the bf16 model met a float32 tensor inside a list)."""
    _, verdict = _written_and_validated(frontier, "eager+bf16-cast", WORKLOADS / "nested_inputs.py", tmp_path)
    assert verdict.max_rel_error is not None and verdict.max_rel_error < 0.25  # bf16's rounding, measured


def test_a_recipe_s_workload_takes_keyword_inputs(frontier: Path, tmp_path: Path) -> None:
    """A workload whose get_model_and_input() returns its inputs as a dict: the optimized workload's callable takes
    them by keyword (its run(*inputs) refused them in bench), and bench runs it."""
    keywords = WORKLOADS / "keyword_inputs.py"
    optimized, _ = _written_and_validated(frontier, "eager+bf16-cast", keywords, tmp_path)
    result = api.bench(BenchRequest(baseline=keywords, optimized=optimized, python=PYTHON, timing=FAST,
                                    output=tmp_path / "bench", project=tmp_path))
    assert result.speedup.point > 0


def test_a_workload_whose_file_name_is_no_module_name_is_imported_by_its_path(frontier: Path, tmp_path: Path) -> None:
    """`my-model.py`: the optimized workload's `from my-model import ...` was a SyntaxError; it loads the file."""
    workload = tmp_path / "baseline" / "my-model.py"
    workload.parent.mkdir()
    workload.write_text((WORKLOADS / "tiny_mlp.py").read_text())
    optimized, verdict = _written_and_validated(frontier, "eager+bf16-cast", workload, tmp_path)
    assert "from my-model import" not in optimized.read_text() and verdict.passed


def test_an_autocast_recipe_written_as_code_passes_validate_in_the_reduced_tier(frontier: Path, tmp_path: Path):
    report = _report(frontier)
    result = report.result("eager+bf16-autocast")
    assert result is not None and result.tier == "reduced"
    winner = Winner(tier="reduced", metric="latency", recipe=result.recipe, time_ns=result.time_ns("latency") or 1.0,
                    max_rel_error=result.error.max_rel_error if result.error else None, code=result.code)
    optimized = write_recipe_workload(WORKLOADS / "tiny_mlp.py", winner, report, frontier, tmp_path)
    assert optimized == tmp_path / "tiny_mlp_optimized.py"  # beside nothing of the user's
    verdict = validate(WORKLOADS / "tiny_mlp.py", optimized, python=sys.executable, seeds=(0,), run_tests=False,
                       tier="reduced", out_dir=tmp_path)
    checks = {c.name: c.status for c in verdict.checks}
    assert verdict.passed and verdict.recipe == "eager+bf16-autocast"
    assert checks["backend_registered"] == checks["backend_invoked"] == checks["fx_passes"] == "skip"
    assert checks["numerics"] == "pass" and checks["output_caching"] == "pass"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_mlp_optimized.py", "validation_report.json"]


def test_an_eager_recipe_s_profile_runs_the_model_as_its_optimize_returns_it(frontier: Path, tmp_path: Path) -> None:
    """An eager recipe compiles nothing: its window is still the callable optimize(model) returned (here under bf16
    autocast), not the bare model of a torch.compile that compiled no graph."""
    report = _report(frontier)
    result = report.result("eager+bf16-autocast")
    assert result is not None
    winner = Winner(tier="reduced", metric="latency", recipe=result.recipe, time_ns=1.0, code=result.code)
    optimized = write_recipe_workload(WORKLOADS / "tiny_mlp.py", winner, report, frontier, tmp_path)
    assert cli(["run", str(optimized), "--compile-mode", "optimized", "-o", str(tmp_path / "run"), "-q"]) == 0
    profile = load_profile(tmp_path / "run" / "profile.json")
    assert not any("compiled no graph" in warning for warning in profile.warnings)
    [relu] = [op for op in profile.operators if op.operator_name == "aten::relu"]
    assert relu.input_dtypes == ["c10::BFloat16"]  # autocast's linear output


def test_optimize_refuses_the_frontier_of_another_workload_before_it_profiles(frontier: Path, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "floor"
    code = cli(["optimize", str(WORKLOADS / "tiny_bag.py"), "--recipes", str(frontier), "--output", str(out)])
    said = capsys.readouterr()
    assert code == 1
    assert f"is the frontier of {WORKLOADS / 'tiny_mlp.py'}, not of" in said.err + said.out
    assert not (out / "runs").exists()  # refused before the first profile


@pytest.mark.slow
def test_optimize_writes_the_floor_into_its_folder_and_reports_the_winner(frontier: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    workloads_before = sorted(p.name for p in WORKLOADS.iterdir())
    out = tmp_path / "floor"
    code = cli(["optimize", str(WORKLOADS / "tiny_mlp.py"), "--recipes", str(frontier), "--tier", "reduced",
                "--budget-s", "0.2", "--warmup", "2", "--calls", "12", "--queued", "12", "--output", str(out),
                "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert sorted(p.name for p in WORKLOADS.iterdir()) == workloads_before  # nothing beside the user's workload
    names = {p.name for p in out.iterdir()}
    assert {"profile.json", "profile_optimized.json", "tiny_mlp_optimized.py", "bench.json", "bench_vs_free.json",
            "validation_report.json", "report.md", "OPTIMIZED_WORKLOAD.md", "analysis_baseline",
            "analysis_optimized", "runs"} <= names
    winner = _report(frontier).winner("reduced")
    assert winner is not None
    validation = json.loads((out / "validation_report.json").read_text())
    assert validation["passed"] and validation["recipe"] == winner.recipe
    free = json.loads((out / "bench_vs_free.json").read_text())
    assert free["baseline"]["recipe"] == winner.recipe and free["optimized"]["how_run"] == "optimize()"
    report = (out / "report.md").read_text()
    lead = report.split("## Against the free frontier")[1].split("## Result")[0]
    assert f"The optimized workload is the reduced tier's winner of the free frontier, {winner.recipe}" in lead
    assert f"applies {winner.recipe}, the reduced tier's winner" in printed and "validation PASS" in printed
    summary = report.split("## Summary")[1].split("## Details")[0]
    lowered = "computes in lower precision (the reduced tier), eager in fp32" in summary
    both_fp32 = "both compute in fp32 (the reduced tier allowed lower precision" in summary
    assert (lowered, both_fp32) == ((True, False) if "+fp32" not in winner.recipe else (False, True)), summary
    # the recipe's workload has no backend and no generated test: its document says what it is, not a backend's text
    doc = (out / "OPTIMIZED_WORKLOAD.md").read_text()
    assert f"with the free recipe **{winner.recipe}** applied as plain code in `optimize(model)`" in doc
    assert "registered `torch.compile` backend" not in doc and "backend=BACKEND_NAME" not in doc
    assert "## Test" not in doc and "backend `?`" not in doc
    assert f"The free recipe **{winner.recipe}** and nothing beyond it" in doc
    assert ("prepare_inputs(inputs)" in doc) == ("def prepare_inputs(" in (out / "tiny_mlp_optimized.py").read_text())
    assert ("The first call compiles" in doc) == (not winner.recipe.startswith("eager+"))


def test_optimize_names_the_stage_it_stopped_at(frontier: Path, tmp_path: Path) -> None:
    broken = json.loads(frontier.read_text())
    broken["winners"] = []
    empty = tmp_path / "recipes.json"
    empty.write_text(json.dumps(broken))
    with pytest.raises(Exception, match="optimize stopped at recipes: no recipe of .* validated in the exact tier"):
        api.optimize(OptimizeRequest(workload=WORKLOADS / "tiny_mlp.py", python=PYTHON, recipes=empty,
                                     output=tmp_path / "out", project=tmp_path))
    assert not (tmp_path / "out").exists()  # a frontier given without a winner is refused before any stage runs


@pytest.mark.parametrize("flag_line, said", [
    ("torch.backends.cudnn.allow_tf32 = False", "stricter than the baseline ran with {'cudnn_allow_tf32': 'True -> "
                                                 "False'}"),
    ('torch.set_float32_matmul_precision("high")', "changed global precision flags {'float32_matmul_precision': "
                                                    "'highest -> high', 'cuda_matmul_allow_tf32': 'False -> True'}"),
])
def test_validate_tells_a_stricter_precision_flag_from_a_looser_one(flag_line: str, said: str, tmp_path: Path) -> None:
    """An optimized workload that sets a global precision flag in optimize(): turning cuDNN's TF32 off (as an exact
    recipe's lines do on a GPU) loses nothing and is said so; a lower float32 matmul precision is the warning."""
    optimized = tmp_path / "tiny_mlp_flagged_optimized.py"
    optimized.write_text(f"""import sys
sys.path.insert(0, {str(WORKLOADS)!r})
import torch
from tiny_mlp import get_model_and_input  # noqa: F401
BACKEND_NAME = "inductor"
APPLIED_PASSES = {{}}
def optimize(model):
    {flag_line}
    return torch.compile(model)
""")
    verdict = validate(WORKLOADS / "tiny_mlp.py", optimized, python=sys.executable, seeds=(0,), run_tests=False,
                       out_dir=tmp_path)
    assert [w for w in verdict.warnings if "precision flags" in w] == [w for w in verdict.warnings if said in w]
    assert any(said in w for w in verdict.warnings), verdict.warnings
    assert loosens("cudnn_allow_tf32", False, True) and not loosens("float32_matmul_precision", "medium", "highest")
