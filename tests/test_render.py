"""Rendering: every template from real files, the stated speedup from bench.json, printed commands that exist.

The inputs are real: profiles assembled from the recorded H200 conv_block runs (eager and inductor), their
analyses from `analyze`, their comparison from `compare`, bench.json and validation_report.json written by
`operator-profiler bench` and `validate` on tests/workloads/tiny_mlp*.py with tiny repetitions, and an
optimizations.json built with the schema. (The bench ran on this machine's CPU, the profiles on an H200: the
report must say so.)
"""

from __future__ import annotations

import json
import lzma
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from conftest import REPO
from fixtures_util import FIXTURES, run_dir
from pydantic import ValidationError

from mcp_server.analysis.analyze import analyze_profile
from mcp_server.cli import build_parser
from mcp_server.cli import main as cli_main
from mcp_server.compare import compare_profiles
from mcp_server.data import data_dir
from mcp_server.errors import ProfileFormatError
from mcp_server.render import render_plan, render_report
from mcp_server.render.baselines import baselines_view
from mcp_server.render.comparison import write_comparison
from mcp_server.render.render import TEMPLATES
from mcp_server.render.views import residual_from_analysis
from mcp_server.schema.analysis import Analysis
from mcp_server.schema.export import schema_text
from mcp_server.schema.io import load_profile
from mcp_server.schema.optimizations import OptimizationPlan, load_optimizations
from mcp_server.schema.proof import BenchResult, ValidationReport
from mcp_server.schema.recipes import RecipesReport

WORKLOADS = REPO / "tests" / "workloads"
FAST_BENCH = ("--warmup", "1", "--calls", "10", "--queued", "10", "--blocks", "2", "--budget-s", "0.2", "--rounds", "3")


def assembled_profile(run: str, dest: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """profile.json of the recorded run directory `run` (e.g. conv_block_eager), assembled in a copy at `dest/run/`.

    `operator-profiler assemble` runs as a child process: ncu_report must not load into a process that has
    imported torch already (the FX pattern tests do), it crashes there.
    """
    path = dest / run / "profile.json"
    if not path.is_file():
        shutil.copytree(run_dir(run, tmp_path_factory), dest / run)
        subprocess.run([sys.executable, "-m", "mcp_server.cli", "assemble", str(dest / run)], cwd=REPO, check=True,
                       capture_output=True, timeout=300)
    return path


def sample_plan(workload: str) -> OptimizationPlan:
    """A two-item plan: item 1's pass is one tiny_mlp_optimized.py applies, item 2 was deferred."""
    item = {
        "id": "mul-add-fusion", "rank": 1, "title": "Fuse scale-and-shift into addcmul", "ir_level": "functional",
        "target": {"operator_name": "aten::batch_norm", "module_path": "features.0.bn",
                   "operator_ids": ["aten::batch_norm#0"]},
        "evidence": [{"metric": "dram_throughput_pct", "value": 0.44, "unit": "%", "condition": "memory-bound",
                      "source": "aten::batch_norm#0"}],
        "rationale": "An elementwise pass over the whole activation.",
        "expected_gain": {"end_to_end_speedup_low": 1.05, "end_to_end_speedup_high": 1.15,
                          "basis": "Amdahl: 15 % of kernel time, most of it removed"},
        "pattern": "knowledge/fx_patterns/conv_bn_fold.py", "pass_name": "fuse_mul_add_to_addcmul",
        "status": "implemented", "status_reason": "tiny_mlp_optimized.py:24",
    }
    deferred = {
        **item, "id": "cuda-graphs", "rank": 2, "title": "Replay as a CUDA graph", "ir_level": "inductor-config",
        "target": {"operator_name": "aten::conv2d"}, "pattern": "knowledge/fx_patterns/cuda_graphs.py",
        "pass_name": "cuda_graphs", "status": "deferred", "status_reason": "needs static shapes",
        "evidence": [{"metric": "gpu_busy_time_ns", "value": 57152, "unit": "ns", "condition": "< 5 % of wall"}],
    }
    return OptimizationPlan(workload=workload, baseline_profile="profile.json", device_name="NVIDIA H200",
                            created_at="2026-11-21T21:00:00+00:00", items=[item, deferred],
                            not_proposed=["channels-last: float32 convolutions, little to gain"])


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "mcp_server.cli", *args, "--quiet"], cwd=REPO, check=True,
                   capture_output=True, timeout=600)


@pytest.fixture(scope="session")
def loop(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every file of one optimization loop, real outputs of the engine."""
    root = tmp_path_factory.mktemp("loop")
    base = assembled_profile("conv_block_eager", root / "runs", tmp_path_factory)
    opt = assembled_profile("conv_block_inductor", root / "runs", tmp_path_factory)
    comparison = compare_profiles(load_profile(base), load_profile(opt))
    write_comparison(comparison, root)
    for name, profile in (("analysis_baseline", base), ("analysis_optimized", opt)):
        analyze_profile(load_profile(profile), root / name, profile_path=profile, measure=False)
    baseline, optimized = WORKLOADS / "tiny_mlp.py", WORKLOADS / "tiny_mlp_optimized.py"
    _cli("bench", str(baseline), str(optimized), *FAST_BENCH, "--input-sets", "1", "--output", str(root))
    _cli("validate", str(baseline), str(optimized), "--seeds", "0", "--bench", str(root / "bench.json"),
         "--output", str(root))
    (root / "optimizations.json").write_text(sample_plan("examples/conv_block/conv_block.py").model_dump_json())
    return {"baseline": base, "optimized": opt, "comparison": root / "comparison.json",
            "bench": root / "bench.json", "validation": root / "validation_report.json",
            "optimizations": root / "optimizations.json", "root": root,
            "analysis_baseline": root / "analysis_baseline" / "analysis.json",
            "analysis": root / "analysis_optimized" / "analysis.json"}


@pytest.fixture(scope="session")
def documents(loop: dict[str, Path]) -> dict[str, str]:
    """The four documents rendered from the loop's files, by file name."""
    out = loop["root"] / "docs"
    paths = render_report(loop["baseline"], out, optimized_profile=loop["optimized"], comparison=loop["comparison"],
                          bench=loop["bench"], validation=loop["validation"], optimizations=loop["optimizations"],
                          analysis=loop["analysis"], project_dir=REPO)
    paths += render_plan(loop["baseline"], loop["optimizations"], out, analysis=loop["analysis_baseline"],
                         project_dir=REPO)
    return {p.name: p.read_text(encoding="utf-8") for p in paths}


def printed_commands(text: str) -> list[list[str]]:
    """Every `operator-profiler ...` line of a document, split as a shell would."""
    return [shlex.split(line.strip()) for line in text.splitlines() if line.strip().startswith("operator-profiler ")]


# --------------------------------------------------------------------------- every template renders


def test_every_template_renders(documents: dict[str, str]) -> None:
    assert set(documents) == set(TEMPLATES) == {p.name[:-3] for p in data_dir("prompts").glob("*.j2")}
    for name, text in documents.items():
        assert "{{" not in text and "{%" not in text, f"{name} kept template syntax"
        assert text.startswith("# ") and text.endswith("\n")


def test_report_states_device_clocks_and_bench_speedup(documents: dict[str, str], loop: dict[str, Path]) -> None:
    report = documents["report.md"]
    bench = BenchResult.model_validate_json(loop["bench"].read_text())
    s = bench.speedup
    assert f"**Measured speedup: {s.point:.3f}× (95 % confidence interval {s.ci_low:.3f}×–{s.ci_high:.3f}×" in report
    level = ", not significant: the interval contains 1.0" if s.ci_low <= 1.0 <= s.ci_high else ""
    assert f"**Speedup**: {s.point:.2f}× (95 % CI {s.ci_low:.2f}×–{s.ci_high:.2f}×{level}) against eager" in report
    assert f"{bench.baseline.summary_of(bench.headline).samples} timed calls per side" in report
    assert f"each side in {bench.rounds} fresh processes of its own" in report
    assert "| GPU | NVIDIA H200 (cuda, 132 SMs, compute capability 9.0) |" in report
    assert "| baseline profile: before capture | 345 | 3201 |" in report
    assert re.search(r"\| baseline profile: ncu replay \(counters\) \| 1\d{3} \| 3\d{3} \|", report)
    # the profiles' summed kernel times (57.0 µs -> 54.8 µs, 1.040×) are context, never the stated speedup
    assert "| gpu_kernel_time_ns | 57.0 µs | 54.8 µs | 1.040× |" in report
    assert "Measured speedup: 1.040" not in report
    assert "bench.json was measured on cpu, the profiles on NVIDIA H200" in report


@pytest.mark.parametrize("interval", [(0.95, 0.76, 1.21), (1.30, 1.12, 1.41), (0.80, 0.71, 0.93)])
def test_the_summarys_speedup_says_when_its_interval_holds_one(loop: dict[str, Path], tmp_path: Path,
                                                                interval: tuple[float, float, float]) -> None:
    """The loop's bench with its latency interval set to one holding 1.0, one above and one below: the summary's
    headline says "not significant" for the first alone (a CPU frontier whose winner is eager read 0.90×, 0.76–1.21)."""
    bench = BenchResult.model_validate_json(loop["bench"].read_text())
    point, low, high = interval
    moved = bench.latency_speedup.model_copy(update={"point": point, "ci_low": low, "ci_high": high})
    path = tmp_path / "bench.json"
    path.write_text(bench.model_copy(update={"latency_speedup": moved}).model_dump_json())
    paths = render_report(loop["baseline"], tmp_path / "docs", bench=path, project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    summary = report.split("## Summary")[1].split("## Details")[0]
    level = ", not significant: the interval contains 1.0" if low <= 1.0 <= high else ""
    assert f"**Speedup**: {point:.2f}× (95 % CI {low:.2f}×–{high:.2f}×{level}) against eager as written" in summary


def test_report_has_per_operator_counters_applied_and_residual(documents: dict[str, str]) -> None:
    report = documents["report.md"]
    fused_row = next(ln for ln in report.splitlines() if ln.startswith("| `triton_per_fused__native_batch_norm"))
    assert "(absorbed aten::batch_norm, aten::relu_, aten::max_pool2d, aten::adaptive_avg_pool2d)" in fused_row
    assert "6.2 µs → 1.1 µs (5.848×)" in fused_row and "4 → 1" in fused_row and "occupancy % 13.0 → 6.1" in fused_row
    applied = report.split("## What was applied")[1].split("## What was not applied")[0]
    assert "Fuse scale-and-shift into addcmul" in applied and "`fuse_mul_add_to_addcmul` | 1×" in applied
    assert "`relu_to_functional` (1×)" in applied, "a pass the plan did not list is reported too"
    not_applied = report.split("## What was not applied")[1].split("## Residual")[0]
    assert "| 2 | Replay as a CUDA graph | deferred | needs static shapes |" in not_applied
    residual = report.split("## Residual opportunities")[1].split("## Validation checks")[0]
    assert "**#1 Replay the compiled graph with CUDA graphs" in residual and "(analysis.json)" in residual
    assert "pattern `knowledge/fx_patterns/cuda_graphs.py`" in residual
    assert "#2 Replay as a CUDA graph (deferred)" in residual
    assert "of the kernel time is still here** — `aten::convolution`" in residual
    assert "| numerics | pass |" in report and "**Validation: PASS** (exact precision tier) on cpu, seeds 0" in report
    assert re.search(r"Relative error of the output with the largest one, out \(seed 0, inputs [ab]\): "
                     r"p50 [^,]+, p90 [^,]+, p99 [^,]+, p99\.9 [^,]+, max ", report)


def test_optimized_workload_document(documents: dict[str, str]) -> None:
    doc = documents["OPTIMIZED_WORKLOAD.md"]
    assert doc.startswith("# `tiny_mlp_optimized`: the optimized workload")
    assert "from tiny_mlp_optimized import get_model_and_input, optimize" in doc
    assert "compiled through its own registered `torch.compile` backend `tiny_mlp_opt`" in doc
    assert "### 1. Fuse scale-and-shift into addcmul — applied" in doc
    assert "### 2. Replay as a CUDA graph — deferred" in doc
    assert "python -m pytest -q tests/workloads/test_tiny_mlp_optimized.py" in doc


def test_plan_documents(documents: dict[str, str]) -> None:
    proposal, work_order = documents["proposal.md"], documents["implementation.md"]
    assert "| `aten::conv2d` | features.0.conv, features.1.conv" in proposal and "57.7 %" in proposal
    assert "dram_throughput_pct=0.44 % (memory-bound) at aten::batch_norm#0" in proposal
    assert "estimate: 1.05×–1.15× end to end" in proposal
    assert "channels-last: float32 convolutions, little to gain" in proposal
    assert '`BACKEND_NAME = "conv_block_opt"`' in work_order
    assert "examples/conv_block/test_conv_block_optimized.py" in work_order
    # the structure is the contract's (tests/test_contract_doc.py): the brief names the slots each item fills
    assert "```python" not in work_order and "docs/optimized-workload-contract.md" in work_order
    assert "its skeleton, with `NAME` = `conv_block`" in work_order
    assert "- Slot: `def fuse_mul_add_to_addcmul(gm: torch.fx.GraphModule) -> int` in `FX_PASSES`" in work_order
    # the CUDA-graph item's options come from its own pattern, and its outputs are cloned
    assert '- Slot: `INDUCTOR_OPTIONS["cuda_graphs"] = cuda_graph_options()`' in work_order
    assert "wrapped in `clone_outputs`, or validate's `output_caching` fails" in work_order
    validate_line = next(argv for argv in printed_commands(work_order) if argv[1] == "validate")
    assert Path(validate_line[validate_line.index("--optimizations") + 1]).name == "optimizations.json"
    benches = [argv for argv in printed_commands(work_order) if argv[1] == "bench"]
    assert [argv[argv.index("--baseline-mode") + 1] for argv in benches] == ["eager", "free"]
    assert all(argv[argv.index("--output") + 1] == "examples/conv_block" for argv in benches)


# --------------------------------------------------------------------------- printed commands exist and work


def test_every_printed_command_parses(documents: dict[str, str]) -> None:
    parser = build_parser()
    seen = set()
    for name, text in documents.items():
        for argv in printed_commands(text):
            assert argv[0] == "operator-profiler"
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"{name} prints a command mcp_server.cli rejects: {shlex.join(argv)}")
            seen.add(args.command)
    assert {"preflight", "run", "compare", "bench", "validate", "report"} <= seen


def test_printed_report_command_reproduces_the_report(documents: dict[str, str], loop: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    line = next(argv for argv in printed_commands(documents["report.md"]) if argv[1] == "report")
    out = Path(line[line.index("--output") + 1])
    monkeypatch.chdir(REPO)
    (out / "report.md").unlink()
    assert cli_main(line[1:]) == 0
    assert (out / "report.md").read_text(encoding="utf-8") == documents["report.md"]
    assert f"wrote {out / 'report.md'}" in capsys.readouterr().out


def test_printed_bench_and_validate_settings_match_the_files(documents: dict[str, str], loop) -> None:
    commands = {argv[1]: argv for argv in printed_commands(documents["report.md"])}
    bench = BenchResult.model_validate_json(loop["bench"].read_text())
    report = ValidationReport.model_validate_json(loop["validation"].read_text())
    b = build_parser().parse_args(commands["bench"][1:])
    assert (b.warmup, b.calls, b.rounds, b.input_sets, b.python) == (1, 10, 3, 1, bench.python_executable)
    assert b.baseline == Path("tests/workloads/tiny_mlp.py")
    v = build_parser().parse_args(commands["validate"][1:])
    assert v.seeds == "0" and v.bench_json == loop["bench"] and v.python == report.python_executable
    order = [argv[1] for argv in printed_commands(documents["report.md"])]
    assert order.index("bench") < order.index("validate"), "validate reads bench.json: bench runs first"


# --------------------------------------------------------------------------- degraded inputs, errors


def test_report_without_bench_claims_no_speedup(loop: dict[str, Path], tmp_path: Path) -> None:
    paths = render_report(loop["baseline"], tmp_path, project_dir=REPO)
    assert [p.name for p in paths] == ["report.md"]
    text = paths[0].read_text()
    assert "Measured speedup" not in text and "no bench.json: no speedup is claimed" in text
    assert "No optimizations.json was given." in text


def test_missing_input_fails_with_a_remedy(loop: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ProfileFormatError, match="bench result not found") as err:
        render_report(loop["baseline"], tmp_path, bench=tmp_path / "nope.json")
    assert err.value.remedy
    assert not (tmp_path / "report.md").exists(), "nothing is written when an input is bad"


def test_report_plan_mode_from_the_command_line(loop: dict[str, Path], tmp_path: Path, capsys) -> None:
    argv = ["report", str(loop["baseline"]), "--optimizations", str(loop["optimizations"]), "--plan",
            "--output", str(tmp_path)]
    assert cli_main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["implementation.md", "proposal.md"]
    assert "wrote" in capsys.readouterr().out


def test_residual_opportunities_skip_what_was_applied(loop: dict[str, Path]) -> None:
    analysis = Analysis.model_validate_json(loop["analysis_baseline"].read_text())
    classes = [o.change_class for o in analysis.opportunities]
    assert "conv_bn_fold" in classes and "cuda_graphs" in classes
    fold = sample_plan("w.py").items[0].model_copy(update={"pattern": "knowledge/fx_patterns/conv_bn_fold.py"})
    rows = residual_from_analysis(analysis, [fold])
    assert len(rows) == len(classes) - 1
    assert all("conv_bn_fold" not in r.pattern for r in rows)
    graphs = next(r for r in rows if r.pattern.endswith("cuda_graphs.py"))
    assert "gpu_utilization_pct=" in graphs.evidence and "% of the window; estimate" in graphs.estimate


def _calibration_section(loop: dict[str, Path], out: Path, baseline_analysis: Path) -> str:
    paths = render_report(loop["baseline"], out, bench=loop["bench"], validation=loop["validation"],
                          optimizations=loop["optimizations"], analysis=loop["analysis"],
                          baseline_analysis=baseline_analysis, project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    assert "## Estimates against the measurement" in report
    return report.split("## Estimates against the measurement")[1].split("## Device and clocks")[0]


@pytest.mark.parametrize("point, low, high, verdict", [
    (1.20, 0.86, 1.53, "consistent with the estimate: 1.20× measured (95 % CI 0.86×–1.53×)"),
    (1.40, 1.30, 1.50, "above the estimate: 1.40× measured"),
    (0.90, 0.85, 0.95, "below the estimate: 0.90× measured"),
])
def test_a_measurement_whose_interval_reaches_the_estimate_is_not_called_above_or_below_it(
    loop: dict[str, Path], tmp_path: Path, point: float, low: float, high: float, verdict: str,
) -> None:
    """The plan estimates 1.05×–1.15× for its applied item; the bench is rewritten to each measurement."""
    bench = json.loads(loop["bench"].read_text())
    bench["latency_speedup"].update(point=point, ci_low=low, ci_high=high)
    rewritten = tmp_path / "bench.json"
    rewritten.write_text(json.dumps(bench))
    section = _calibration_section({**loop, "bench": rewritten}, tmp_path / "out", loop["analysis_baseline"])
    assert verdict in section


def test_report_sets_the_estimates_beside_the_measured_speedup(loop: dict[str, Path], tmp_path: Path) -> None:
    section = _calibration_section(loop, tmp_path, loop["analysis_baseline"])
    bench = BenchResult.model_validate_json(loop["bench"].read_text())
    analysis = Analysis.model_validate_json(loop["analysis_baseline"].read_text())
    assert analysis.timeline is not None and analysis.speed_of_light is not None
    fold = next(o for o in analysis.opportunities if o.change_class == "conv_bn_fold")
    window = analysis.timeline.window_ns
    assert f"Measured: **{bench.speedup.point:.2f}×**" in section
    assert "1.05×–1.15× (the plan)" in section  # the applied item's estimate; the deferred one is left out
    assert f"≤ {window / (window - fold.estimated_saving_ns):.2f}× (analysis, upper bound)" in section
    assert "the profiled window (no timing pass ran" in section  # the recorded H200 run predates the timing pass
    s = bench.speedup
    verdict = ("consistent with the estimate" if s.ci_low <= 1.15 and s.ci_high >= 1.05 else
               "below the estimate" if s.point < 1.05 else "above the estimate" if s.point > 1.15 else
               "within the estimate")
    assert verdict in section
    assert f"a speedup above {analysis.speed_of_light.max_plausible_speedup:.2f}× is suspect" in section
    assert "Replay as a CUDA graph" not in section


def test_a_speedup_above_the_speed_of_light_is_flagged(loop: dict[str, Path], tmp_path: Path) -> None:
    analysis = Analysis.model_validate_json(loop["analysis_baseline"].read_text())
    assert analysis.speed_of_light is not None
    bench = BenchResult.model_validate_json(loop["bench"].read_text())
    low = analysis.speed_of_light.model_copy(update={"max_plausible_speedup": bench.speedup.point / 2})
    path = tmp_path / "analysis.json"
    path.write_text(analysis.model_copy(update={"speed_of_light": low}).model_dump_json())
    section = _calibration_section(loop, tmp_path / "out", path)
    assert f"the measured {bench.speedup.point:.2f}× exceeds it" in section


def test_proposal_quotes_the_diagnosis(documents: dict[str, str]) -> None:
    proposal = documents["proposal.md"]
    assert "## Diagnosis (analysis.json)" in proposal and "launch_overhead: The GPU is busy" in proposal
    assert "Fold 6 batch norms into the preceding convolutions" in proposal


# --------------------------------------------------------------------------- optimizations.json schema


def test_published_schema_is_current_and_accepts_the_sample() -> None:
    published = json.loads((REPO / "schemas" / "optimizations.schema.json").read_text())
    assert (REPO / "schemas" / "optimizations.schema.json").read_text() == schema_text(OptimizationPlan)
    jsonschema.Draft202012Validator.check_schema(published)
    jsonschema.validate(json.loads(sample_plan("w.py").model_dump_json()), published)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["items"].reverse(), "rank order"),
    (lambda d: d["items"][1].update(id=d["items"][0]["id"]), "unique"),
    (lambda d: d["items"][0].update(pattern="../knowledge/x.py"), "under knowledge/"),
    (lambda d: d["items"][0]["expected_gain"].update(end_to_end_speedup_low=2.0), "must not exceed"),
    (lambda d: d["items"][0]["expected_gain"].update(label="measured"), "estimate"),
    (lambda d: d["items"][0].update(evidence=[]), "at least 1"),
    (lambda d: d["items"][0].update(ir_level="triton"), "functional"),
    (lambda d: d["items"][0].update(surprise=True), "Extra inputs"),
])
def test_invalid_plans_are_rejected(change, message: str, tmp_path: Path) -> None:
    data = json.loads(sample_plan("w.py").model_dump_json())
    change(data)
    with pytest.raises(ValidationError, match=message):
        OptimizationPlan.model_validate(data)
    path = tmp_path / "optimizations.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileFormatError, match="is not a valid optimizations.json: "):
        load_optimizations(path)


def test_report_leads_with_the_frontiers_winner(loop: dict[str, Path], tmp_path: Path) -> None:
    """A real frontier of the tiny workload (the reference and one recipe, on the CPU) and a real bench of the optimized
    workload against the winner of its tier: report.md opens with that comparison and the winner's lines, and the
    table beneath sets eager and the winner side by side, both metrics."""
    baseline, optimized = WORKLOADS / "tiny_mlp.py", WORKLOADS / "tiny_mlp_optimized.py"
    _cli("recipes", str(baseline), "--only", "eager+bf16-autocast", "--seeds", "0", "--budget-s", "0.2",
         "--output", str(tmp_path))
    _cli("bench", str(baseline), str(optimized), *FAST_BENCH, "--input-sets", "1",
         "--baseline-mode", "free", "--tier", "reduced", "--recipes", str(tmp_path / "recipes.json"),
         "--output", str(tmp_path))
    free_path = tmp_path / "bench_vs_free.json"
    free = BenchResult.model_validate_json(free_path.read_text())
    winner = RecipesReport.model_validate_json((tmp_path / "recipes.json").read_text()).winner("reduced")
    assert winner is not None and free.baseline.recipe == winner.recipe and free.tier == "reduced"
    paths = render_report(loop["baseline"], tmp_path / "docs", bench=loop["bench"], recipes=tmp_path / "recipes.json",
                          bench_vs_free=free_path, project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    assert report.index("## Against the free frontier") < report.index("## Result")
    lead = report.split("## Against the free frontier")[1].split("## Result")[0]
    assert f"**{winner.recipe}**" in lead and all(line in lead for line in winner.code)
    s = free.speedup
    measured = f"{s.point:.3f}× by latency (95 % CI {s.ci_low:.3f}×–{s.ci_high:.3f}×"
    assert measured in lead
    expected = ("beats the reduced tier's winner" if s.ci_low > 1 else
                "is level with the free recipe" if s.ci_high >= 1 else "is slower than the free recipe")
    assert expected in lead
    table = report.split("**Against what a user gets for free**")[1].split("\n\n")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| baseline")]
    assert [r.split(" | ")[0] for r in rows] == ["| eager (as written)", "| reduced tier's frontier winner"]
    assert "back-to-back" in rows[1] and free_path.name in rows[1]


def test_a_module_level_item_goes_into_optimize(loop: dict[str, Path], tmp_path: Path) -> None:
    plan = sample_plan("examples/conv_block/conv_block.py").model_dump()
    plan["tier"] = "reduced"
    plan["items"][0].update(ir_level="module", pass_name="bf16_weights", precision_change=True,
                            pattern="knowledge/fx_patterns/bf16_weights.py", title="Keep weights in bf16")
    path = tmp_path / "optimizations.json"
    path.write_text(OptimizationPlan.model_validate(plan).model_dump_json())
    written = render_plan(loop["baseline"], path, tmp_path, analysis=loop["analysis_baseline"], project_dir=REPO)
    proposal = next(p for p in written if p.name == "proposal.md").read_text()
    work_order = next(p for p in written if p.name == "implementation.md").read_text()
    assert "Precision tier: **reduced**" in proposal
    item = work_order.split("### 1. Keep weights in bf16", 1)[1].split("###", 1)[0]
    assert "- Slot: `optimize(model)`: a change to the model before `torch.compile`" in item
    assert "def bf16_weights(" not in item
    assert "IR level `module`: a change to the nn.Module inside optimize(model)" in work_order
    commands = [line for line in work_order.splitlines() if line.strip().startswith("operator-profiler ")]
    validate = next(c for c in commands if " validate " in c)
    free = next(c for c in commands if "--baseline-mode free" in c)
    assert "--tier reduced" in validate and "--tier reduced" in free, "the plan's tier reaches validate and bench"
    assert "the reduced tier's winner of the free frontier" in work_order


LEVEL = "is level with the free recipe"


LEVEL_SPEEDUP = {"point": 1.001, "ci_low": 0.995, "ci_high": 1.006, "significant": False}
SLOWER_SPEEDUP = {"point": 0.994, "ci_low": 0.994, "ci_high": 0.995, "significant": True}


@pytest.mark.parametrize("example, analysis_file, speedup, verdict_is, says", [
    ("sdpa_attention", "analysis.json", LEVEL_SPEEDUP, LEVEL,
     "with its FP32 FLOPs on BF16 tensor cores the floor would be"),
    ("lstm_sequence_encoder", "analysis_optimized/analysis.json", LEVEL_SPEEDUP, LEVEL,
     "tensor cores would not lower it"),
    ("depthwise_separable_conv", "analysis_optimized/analysis.json", SLOWER_SPEEDUP,
     "is slower than the free recipe", "tensor cores would not lower it"),
])
def test_a_workload_not_faster_than_the_free_recipe_is_told_what_the_floor_says(
    example: str, analysis_file: str, speedup: dict[str, object], verdict_is: str, says: str, tmp_path: Path
) -> None:
    """A loop that ends level with its free recipe or slower than it: the verdict says so, quotes the analysis's
    speed-of-light floor (its numbers, in ms) and whether tensor cores would lower it. Each folder's H100 free
    bench is rewritten to that result: a level, not significant 1.001x (sdpa_attention with its FP32 baseline
    analysis, whose floor falls on tensor cores; lstm_sequence_encoder with its optimized one, whose floor is
    bytes), or depthwise_separable_conv's earlier measurement with the autocast wrapper, 0.994x (0.994-0.995)."""
    folder = REPO / "examples" / example
    analysis = Analysis.model_validate_json((folder / analysis_file).read_text())
    floor = analysis.speed_of_light
    assert floor is not None
    rewritten = json.loads((folder / "bench_vs_free.json").read_text())
    rewritten["latency_speedup"].update(speedup)
    free = tmp_path / "bench_vs_free.json"
    free.write_text(json.dumps(rewritten))
    paths = render_report(folder / "profile.json", tmp_path, analysis=folder / analysis_file,
                          bench=folder / "bench.json", recipes=folder / "recipes.json",
                          bench_vs_free=free, optimizations=folder / "optimizations.json", project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    verdict = report.split("## Against the free frontier")[1].split("## Result")[0]
    assert verdict_is in verdict and says in verdict
    assert f"{floor.pct_of_speed_of_light:.0f} % of its speed of light" in verdict
    assert f"floor {floor.floor_ns / 1e6:.3f} ms, window {floor.window_ns / 1e6:.3f} ms" in verdict


def test_a_rejected_item_is_listed_apart_from_the_changes_to_make(loop: dict[str, Path], tmp_path: Path) -> None:
    """An item the bench rejected (gpt2's plan with its SDPA item marked so): proposal.md and implementation.md
    list it under "Tried and rejected" with its reason, never among the changes to implement."""
    folder = REPO / "examples" / "gpt2"
    plan = OptimizationPlan.model_validate_json((folder / "optimizations.json").read_text())
    for item in plan.items:
        if item.pass_name == "sdpa_substitution":
            item.status, item.status_reason = "rejected", "(this test's) its bench did not beat the floor"
    changed = tmp_path / "optimizations.json"
    changed.write_text(plan.model_dump_json())
    written = render_plan(folder / "profile.json", changed, tmp_path / "out", analysis=folder / "analysis.json",
                          project_dir=REPO)
    rejected = [i for i in plan.items if i.status == "rejected"]
    assert len(rejected) == 1
    for name in ("proposal.md", "implementation.md"):
        text = next(p for p in written if p.name == name).read_text()
        changes, tried = text.split("## Tried and rejected", 1)
        for item in rejected:
            assert item.title not in changes
            assert f"- {item.title} (`{item.pattern}`): {item.status_reason}" in tried


def test_the_usage_line_names_module_level_changes_around_torch_compile(tmp_path: Path) -> None:
    """gpt2's optimize() wraps torch.compile in module-level changes (the float16 cast, the whole-call CUDA graph):
    its OPTIMIZED_WORKLOAD.md says so. sdpa_attention's hand-written plan (tests/fixtures, before the frontier) cut
    to its FX pass and Inductor option (QKV fusion, CUDA graphs; its module-level FP16 item left out) reads as a
    plain torch.compile. The opening says a backend
    rewrites the graph only where an applied item is an FX pass (the QKV fusion), and that it hands the graph to
    Inductor with options where the applied items are Inductor options (the same plan cut to CUDA graphs)."""
    hand_written = lzma.decompress((FIXTURES / "sdpa_attention_hand_written.optimizations.json.xz").read_bytes())
    cuts = {}
    for label, levels in (("sdpa_fx", ("functional", "inductor-config")), ("sdpa_inductor", ("inductor-config",))):
        plan = json.loads(hand_written)
        plan["items"] = [i for i in plan["items"] if i["ir_level"] in levels]
        for rank, item in enumerate(plan["items"], 1):
            item["rank"] = rank
        plan["tier"] = "exact"
        cuts[label] = tmp_path / f"{label}.json"
        cuts[label].write_text(OptimizationPlan.model_validate(plan).model_dump_json())
    lines, openings = {}, {}
    for label, example, plan_file in (("gpt2", "gpt2", None), ("sdpa_fx", "sdpa_attention", cuts["sdpa_fx"]),
                                      ("sdpa_inductor", "sdpa_attention", cuts["sdpa_inductor"])):
        folder = REPO / "examples" / example
        validation = folder / "validation_report.json"
        if plan_file is not None:  # the hand-written workload's own validation: the passes it applied
            validation = tmp_path / f"{label}_validation_report.json"
            validation.write_bytes(lzma.decompress(
                (FIXTURES / "sdpa_attention_hand_written.validation_report.json.xz").read_bytes()))
        paths = render_report(folder / "profile.json", tmp_path / label, bench=folder / "bench.json",
                              validation=validation, optimizations=plan_file or folder / "optimizations.json",
                              project_dir=REPO)
        text = next(p for p in paths if p.name == "OPTIMIZED_WORKLOAD.md").read_text()
        lines[label] = next(line for line in text.splitlines() if line.startswith("compiled = optimize(model)"))
        openings[label] = text.splitlines()[2]
    assert "which rewrites the graph before handing it on" in openings["sdpa_fx"]
    assert "which hands the graph to Inductor with the options below" in openings["sdpa_inductor"]
    assert "rewrites" not in openings["sdpa_inductor"]
    assert lines["gpt2"].endswith("# the module-level changes below, around torch.compile(model, backend=BACKEND_NAME)")
    assert lines["sdpa_fx"].endswith("# torch.compile(model, backend=BACKEND_NAME)")
    assert "module-level" not in lines["sdpa_fx"]


def test_the_analysis_bound_says_which_applied_changes_it_covers() -> None:
    """conv_block's H100 loop applied three changes; only channels-last has an opportunity of its pattern in the
    baseline analysis. Its plan's estimates read against eager as written (the analysis's bounds are against that
    baseline; the folder's own plan is against the frontier's winner, beside which no analysis bound is set): the
    combined analysis bound says it covers 1 of 3; with that change alone applied, the bound covers everything
    applied and the measured 3.39× exceeds it, which the verdict says."""
    from mcp_server.render.calibration import calibration_view

    folder = REPO / "examples" / "conv_block"
    plan = load_optimizations(folder / "optimizations.json")
    plan = plan.model_copy(update={"items": [i.model_copy(update={"expected_gain": i.expected_gain.model_copy(
        update={"against": "eager"})}) for i in plan.items]})
    assert calibration_view(load_optimizations(folder / "optimizations.json"), ValidationReport.model_validate_json(
        (folder / "validation_report.json").read_text()), None, None).verdict.startswith(
        "the estimates are against the frontier's winner and no bench_vs_free.json")
    validation = ValidationReport.model_validate_json((folder / "validation_report.json").read_text())
    bench = BenchResult.model_validate_json((folder / "bench.json").read_text())
    analysis = Analysis.model_validate_json((folder / "analysis.json").read_text())
    view = calibration_view(plan, validation, bench, analysis)
    assert view is not None and view.analysis_estimate is not None
    assert view.analysis_covers == "1 of 3 applied changes only; the other 2 have no opportunity of their pattern"
    assert "understated" not in view.verdict
    alone = validation.model_copy(update={"applied_passes": {"channels_last": 3}})
    view = calibration_view(plan, alone, bench, analysis)
    assert view is not None and view.analysis_covers is None and view.analysis_estimate is not None
    assert view.analysis_estimate < bench.speedup.point
    assert f"the analysis's upper bound ({view.analysis_estimate:.2f}×) is below the measurement" in view.verdict


def _render_folder(name: str, out: Path) -> dict[str, str]:
    """report.md and OPTIMIZED_WORKLOAD.md rendered now from an example folder's H100 files, as its loop did."""
    d = REPO / "examples" / name
    paths = render_report(
        d / "profile.json", out, optimized_profile=d / "profile_optimized.json",
        analysis=d / "analysis_optimized" / "analysis.json", baseline_analysis=d / "analysis.json",
        comparison=d / "comparison.json", bench=d / "bench.json", recipes=d / "recipes.json",
        bench_vs_free=d / "bench_vs_free.json", validation=d / "validation_report.json",
        optimizations=d / "optimizations.json", project_dir=REPO,
    )
    return {p.name: p.read_text(encoding="utf-8") for p in paths if p.suffix == ".md"}


def test_outputs_returned_in_a_lower_precision_are_named_in_the_report(tmp_path: Path):
    """A reduced-tier validation whose output came back in float16 names it, with the baseline's dtype, in the
    validation view that report.md and OPTIMIZED_WORKLOAD.md render; an exact-tier one names none."""
    from mcp_server.proof.validate import load_validation_report
    from mcp_server.render.views import validation_view

    reduced = validation_view(load_validation_report(REPO / "examples/embedding_projection/validation_report.json"))
    assert reduced.tier == "reduced" and reduced.reduced_dtype_outputs == ["out float16 (baseline float32)"]
    exact = validation_view(load_validation_report(REPO / "examples/lstm_sequence_encoder/validation_report.json"))
    assert exact.reduced_dtype_outputs == []
    documents = _render_folder("embedding_projection", tmp_path)
    assert "out float16 (baseline float32)" in documents["report.md"].split("## Estimates")[0]
    assert "out float16 (baseline float32)" in documents["OPTIMIZED_WORKLOAD.md"]


def test_the_residual_counts_unattributed_kernel_time_in_the_shares(tmp_path: Path) -> None:
    """lstm_sequence_encoder's optimized H100 run as assembled before graph replays followed their clones to the
    captured node (`h100_lstm_unattributed_replays.*`): 535 of its kernels are replays no operator range encloses.
    The residual names them first, with their share of the kernel time, and the operators' shares are of all the
    kernel time, not only of what was attributed (the embedding's kernel is 0.4 %, not 79 %)."""
    d = REPO / "examples" / "lstm_sequence_encoder"
    files = {}
    for kind in ("profile", "analysis"):
        files[kind] = tmp_path / f"{kind}.json"
        files[kind].write_bytes(lzma.decompress((FIXTURES / f"h100_lstm_unattributed_replays.{kind}.json.xz")
                                                .read_bytes()))
    comparison = tmp_path / "comparison"
    comparison.mkdir()
    write_comparison(compare_profiles(load_profile(d / "profile.json"), load_profile(files["profile"]),
                                      allow_mismatch=True), comparison)
    paths = render_report(
        d / "profile.json", tmp_path / "out", optimized_profile=files["profile"], analysis=files["analysis"],
        baseline_analysis=d / "analysis.json", comparison=comparison / "comparison.json", bench=d / "bench.json",
        recipes=d / "recipes.json", bench_vs_free=d / "bench_vs_free.json", validation=d / "validation_report.json",
        optimizations=d / "optimizations.json", project_dir=REPO,
    )
    report = next(p for p in paths if p.name == "report.md").read_text(encoding="utf-8")
    residual = report.split("## Residual opportunities")[1].split("## Validation checks")[0]
    rows = [line for line in residual.splitlines() if line.startswith("- **")]
    assert rows[0].startswith("- **99.5 % of the kernel time is in kernels no operator encloses** — 535 unattributed")
    assert "- **0.4 % of the kernel time is still here** — `triton_poi_fused_embedding_0`" in residual
    assert "99.5 % of the optimized profile's kernel time is in 535 kernels" in report.split("## Result")[0]


def _mlp_report(tmp_path: Path, plan: Path | None = None) -> str:
    """mlp_activations' report (H100 files of its folder), rendered again with `plan` in place of its own."""
    folder = REPO / "examples" / "mlp_activations"
    paths = render_report(folder / "profile.json", tmp_path, optimized_profile=folder / "profile_optimized.json",
                          analysis=folder / "analysis_optimized" / "analysis.json",
                          baseline_analysis=folder / "analysis.json", bench=folder / "bench.json",
                          recipes=folder / "recipes.json", bench_vs_free=folder / "bench_vs_free.json",
                          validation=folder / "validation_report.json",
                          optimizations=plan or folder / "optimizations.json", project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    return report.split("### Estimates against the measurement")[1].split("###")[0]


def test_estimates_against_the_winner_are_set_beside_the_bench_against_the_winner(tmp_path: Path) -> None:
    """mlp_activations' plan starts from the floor: its items' estimates are against the frontier's winner
    (`against: winner`), so the report sets them beside bench_vs_free.json's 1.49x, not bench.json's 7.40x against
    eager, which the earlier rendering called "above the estimate"; a plan mixing the two baselines gets no verdict."""
    folder = REPO / "examples" / "mlp_activations"
    free = BenchResult.model_validate_json((folder / "bench_vs_free.json").read_text())
    section = _mlp_report(tmp_path / "winner")
    assert f"Measured: **{free.speedup.point:.2f}×**" in section
    assert f"against the baseline run {free.baseline.how_run}" in section and "consistent with the estimate" in section
    assert "end to end against the frontier's winner" in section
    mixed = json.loads((folder / "optimizations.json").read_text())
    mixed["items"][0]["expected_gain"]["against"] = "eager"
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    section = _mlp_report(tmp_path / "mixed", tmp_path / "mixed.json")
    assert "against different baselines" in section and "Measured:" not in section


def test_estimates_against_the_winner_without_a_bench_against_it_are_left_unmeasured() -> None:
    """bench.json's speedup is against eager: it is not set beside estimates against the frontier's winner."""
    from mcp_server.render.calibration import calibration_view

    folder = REPO / "examples" / "mlp_activations"
    view = calibration_view(load_optimizations(folder / "optimizations.json"),
                            ValidationReport.model_validate_json((folder / "validation_report.json").read_text()),
                            BenchResult.model_validate_json((folder / "bench.json").read_text()),
                            Analysis.model_validate_json((folder / "analysis.json").read_text()), bench_vs_free=None)
    assert view is not None and view.rows and view.measured is None and view.measured_ci is None
    assert view.verdict.startswith("the estimates are against the frontier's winner and no bench_vs_free.json")
    assert view.analysis_estimate is None and view.analysis_covers is None and view.ceiling is None


def test_a_frontier_of_a_model_written_in_bfloat16_is_read_against_eager_as_written(
        loop: dict[str, Path], tmp_path: Path) -> None:
    """The bfloat16 decoder's H200 frontier (tests/fixtures/h200_decoder_bf16_recipes.json.xz): the report names its
    reference as the frontier does, and a reduced-tier headline says what eager as written computes in."""
    recipes = tmp_path / "recipes.json"
    recipes.write_bytes(lzma.decompress((FIXTURES / "h200_decoder_bf16_recipes.json.xz").read_bytes()))
    _cli("validate", str(WORKLOADS / "tiny_mlp.py"), str(WORKLOADS / "tiny_mlp_optimized.py"), "--seeds", "0",
         "--tier", "reduced", "--output", str(tmp_path))
    validation = tmp_path / "validation_report.json"
    paths = render_report(loop["baseline"], tmp_path / "docs", bench=loop["bench"], validation=validation,
                          recipes=recipes, project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    assert "× eager as written in bfloat16:" in report and "× fp32 eager" not in report
    assert "against eager as written, by latency, on cpu: eager as written computes in bfloat16; the optimized " \
           "workload is held to the reduced tier against it" in report


def test_a_winner_one_process_cannot_tell_from_its_runner_up_is_followed_by_it(loop: dict[str, Path],
                                                                               tmp_path: Path) -> None:
    """The DLRM-style recommender's H200 frontier (tests/fixtures/h200_dlrm_recipes.json.xz): the reduced tier's
    winner compile+fp16-cast, 588.9 µs in its process, and eager+fp16-cast, 595.6 µs in its own."""
    recipes = tmp_path / "recipes.json"
    recipes.write_bytes(lzma.decompress((FIXTURES / "h200_dlrm_recipes.json.xz").read_bytes()))
    _cli("validate", str(WORKLOADS / "tiny_mlp.py"), str(WORKLOADS / "tiny_mlp_optimized.py"), "--seeds", "0",
         "--tier", "reduced", "--output", str(tmp_path))
    paths = render_report(loop["baseline"], tmp_path / "docs", bench=loop["bench"],
                          validation=tmp_path / "validation_report.json", recipes=recipes, project_dir=REPO)
    report = next(p for p in paths if p.name == "report.md").read_text()
    assert "**compile+fp16-cast**, 588.9 µs per call" in report
    assert ("Close behind it: eager+fp16-cast measured 595.6 µs by latency in its own process, within the 1.15× by "
            "which the processes of one host-bound recipe can differ: one process each does not tell the two apart "
            "(`recipes --runoff 2` runs each again, or `bench` the two).") in report


def test_a_cuda_graph_winner_applied_as_it_is_says_its_outputs_are_copied_and_the_recipe_s_are_not() -> None:
    """The ConvNeXt-style CNN's H200 frontier (tests/fixtures/h200_convnext_recipes.json.xz): its reduced winner
    replays CUDA graph trees, so the workload `optimize` writes copies each call's outputs (a steady-state replay
    overwrites the last ones in silence) where the pasted recipe does not: the verdict says so and names the way
    beyond. The Fourier operator's reduced winner (tests/fixtures/h200_fno_recipes.json.xz), an eager recipe, copies
    nothing, and its verdict says nothing of copies."""
    convnext = RecipesReport.model_validate_json(
        lzma.decompress((FIXTURES / "h200_convnext_recipes.json.xz").read_bytes()))
    winner = convnext.winner("reduced")
    assert winner is not None and winner.recipe.startswith("reduce-overhead+")
    view = baselines_view(None, None, (convnext, "recipes.json"), tier="reduced", applies=winner.recipe)
    assert view is not None and view.frontier is not None
    said = view.frontier.verdict
    assert said.startswith(f"The optimized workload is the reduced tier's winner of the free frontier, {winner.recipe}")
    assert "copies each call's outputs, which the next CUDA graph replay would overwrite in silence" in said
    assert "knowledge/fx_patterns/whole_forward_graph.md" in said
    fno = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_fno_recipes.json.xz").read_bytes()))
    eager = fno.winner("reduced")
    assert eager is not None and eager.recipe.startswith("eager+")
    view = baselines_view(None, None, (fno, "recipes.json"), tier="reduced", applies=eager.recipe)
    assert view is not None and view.frontier is not None and "CUDA graph" not in view.frontier.verdict
