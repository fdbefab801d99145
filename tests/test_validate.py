"""validate: a correct optimized workload passes; deliberately wrong ones fail with the right check named.

Every validation runs the real child process on the tiny workloads in tests/workloads/ (CPU). Each workload
is validated once per module (the runs are shared by the tests that read them) and concurrently, two at a time.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mcp_server.errors import UsageError, WorkloadError
from mcp_server.proof.validate import (
    VALIDATION_JSON,
    generated_test_path,
    load_validation_report,
    parse_tolerances,
    render_checks,
    speedup_check,
    validate,
)
from mcp_server.schema.proof import ValidationReport

WORKLOADS = Path(__file__).resolve().parent / "workloads"
BASELINE = WORKLOADS / "tiny_mlp.py"
CORRECT = WORKLOADS / "tiny_mlp_optimized.py"
WRONG = {
    "numerics": WORKLOADS / "tiny_mlp_wrong_numerics_optimized.py",
    "cached": WORKLOADS / "tiny_mlp_wrong_cached_optimized.py",
    "mutation": WORKLOADS / "tiny_mlp_wrong_mutation_optimized.py",
    "uncalled": WORKLOADS / "tiny_mlp_wrong_uncalled_optimized.py",
    "replayed": WORKLOADS / "tiny_mlp_wrong_replayed_optimized.py",
}
SEEDS = (0, 1)


def _check(report: ValidationReport, name: str):
    return next(c for c in report.checks if c.name == name)


@pytest.fixture(scope="module")
def correct_dir(tmp_path_factory) -> Path:
    """Where the correct workload's validation writes its report and logs."""
    return tmp_path_factory.mktemp("correct")


@pytest.fixture(scope="module")
def reports(correct_dir) -> dict[str, ValidationReport]:
    """Validate the correct workload (with its pytest file and a plausible speedup) and every wrong one."""
    jobs = {
        "correct": dict(optimized=CORRECT, seeds=(0, 1, 2), run_tests=True, speedup=1.3, max_plausible_speedup=4.0,
                        out_dir=correct_dir),
        "loose": dict(optimized=WRONG["numerics"], seeds=(0,), run_tests=False, tolerances={"float32": 0.05}),
        **{name: dict(optimized=path, seeds=SEEDS, run_tests=False) for name, path in WRONG.items()},
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(validate, BASELINE, python=sys.executable, **job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
def test_correct_optimized_workload_passes_every_check(reports):
    report = reports["correct"]
    assert report.passed, render_checks(report)
    assert report.failed_checks == []
    assert {c.name: c.status for c in report.checks} == {
        "contract": "pass", "backend_registered": "pass", "backend_invoked": "pass", "fx_passes": "pass",
        "runs": "pass", "shapes_dtypes": "pass", "finite": "pass", "numerics": "pass", "input_mutation": "pass",
        "output_aliasing": "pass", "output_caching": "pass", "pytest": "pass", "speedup_plausible": "pass",
        "planned_passes": "skip",
    }
    assert report.backend_name == "tiny_mlp_opt" and report.backend_calls >= 1
    assert report.applied_passes == {"relu_to_functional": 1, "fuse_mul_add_to_addcmul": 1}
    assert report.seeds == [0, 1, 2] and report.device_type in ("cpu", "cuda")
    numerics = _check(report, "numerics")
    assert len(numerics.outputs) == 6  # 3 seeds x 2 input sets x 1 output
    for output in numerics.outputs:
        assert output.passed and output.tolerance_class == "float32" and output.rtol == 1e-4  # no conv: no TF32
        assert output.shape == [8, 4] and output.dtype == "torch.float32"
        assert output.max_abs_error is not None and output.max_rel_error < 1e-4
    assert report.max_rel_error < 1e-4
    assert "test_tiny_mlp_optimized.py passed" in _check(report, "pytest").detail


@pytest.mark.slow
def test_report_and_logs_are_written_to_out_dir(reports, correct_dir):
    written = correct_dir / VALIDATION_JSON
    assert load_validation_report(written) == reports["correct"]
    assert json.loads(written.read_text())["passed"] is True
    assert {p.name for p in correct_dir.iterdir()} == {"validation_report.json"}  # the children's files stay out


@pytest.mark.slow
def test_a_pass_that_changes_numerics_fails_numerics(reports):
    report = reports["numerics"]
    assert not report.passed
    assert "numerics" in report.failed_checks
    assert report.max_rel_error > 1e-3  # the output is scaled by 1.01
    failing = [o for o in _check(report, "numerics").outputs if not o.passed]
    assert len(failing) == 2 * len(SEEDS)
    for output in failing:  # the distribution of the error, not only its maximum: ordered, below the max
        levels = output.rel_error_percentiles
        assert list(levels) == ["p50", "p90", "p99", "p99.9"]
        assert list(levels.values()) == sorted(levels.values())
        assert 1e-3 < levels["p50"] <= levels["p99.9"] <= output.max_rel_error * (1 + 1e-9)
    assert _check(report, "backend_invoked").passed and _check(report, "input_mutation").passed
    assert report.applied_passes["scale_outputs"] >= 1


@pytest.mark.slow
def test_tolerances_are_configurable(reports):
    report = reports["loose"]
    assert _check(report, "numerics").passed
    assert report.tolerances["float32"] == 0.05


@pytest.mark.slow
def test_cached_outputs_fail_output_caching(reports):
    report = reports["cached"]
    assert not report.passed
    assert "output_caching" in report.failed_checks
    assert "same memory" in _check(report, "output_caching").detail


@pytest.mark.slow
def test_an_output_a_later_replay_overwrote_fails_output_caching_not_validate(reports):
    """A CUDA-graph workload that hands out its replay's memory (reading the first output after the second call
    raises): a failed check on the optimized workload, not an error blamed on the baseline."""
    report = reports["replayed"]
    assert not report.passed and "output_caching" in report.failed_checks
    detail = _check(report, "output_caching").detail
    assert "overwrote the first call's output" in detail and "clone" in detail
    assert _check(report, "numerics").passed and _check(report, "runs").passed


@pytest.mark.slow
def test_input_mutation_fails_input_mutation(reports):
    report = reports["mutation"]
    assert not report.passed
    assert report.failed_checks == ["input_mutation"]
    assert "input[0]" in _check(report, "input_mutation").detail
    assert _check(report, "numerics").passed  # the outputs are right: only the caller's input is clobbered


@pytest.mark.slow
def test_a_backend_that_is_never_called_fails_backend_invoked(reports):
    report = reports["uncalled"]
    assert not report.passed
    assert "backend_invoked" in report.failed_checks
    assert "returned the model itself" in _check(report, "backend_invoked").detail
    assert _check(report, "backend_registered").passed
    assert report.backend_calls == 0


def test_speedup_above_the_roofline_bound_is_suspect():
    check = speedup_check(12.0, 3.0)
    assert check.status == "fail" and check.detail.startswith("suspect")
    assert speedup_check(2.0, 3.0).passed
    assert speedup_check(None, 3.0).status == "skip" and speedup_check(2.0, None).status == "skip"


def test_tolerance_options_parse():
    assert parse_tolerances(["float32=1e-3", "bfloat16=0.02"]) == {"float32": 1e-3, "bfloat16": 0.02}
    with pytest.raises(UsageError, match="CLASS=RTOL"):
        parse_tolerances(["float32"])
    with pytest.raises(UsageError, match="unknown tolerance class"):
        parse_tolerances(["fp8=0.1"])


def test_generated_test_file_sits_beside_the_workload():
    assert generated_test_path(CORRECT) == WORKLOADS / "test_tiny_mlp_optimized.py"


def test_bad_options_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match="tolerance class"):
        validate(BASELINE, CORRECT, tolerances={"float8": 0.1})
    with pytest.raises(UsageError, match="seed"):
        validate(BASELINE, CORRECT, seeds=())
    with pytest.raises(UsageError, match="--rtol"):
        validate(BASELINE, CORRECT, rtol=-1.0)
    with pytest.raises(WorkloadError, match="not found"):
        validate(BASELINE, tmp_path / "nope_optimized.py")


@pytest.mark.slow
def test_the_bound_comes_from_the_baselines_speed_of_light(tmp_path):
    """`validate --analysis`: the baseline analysis's max_plausible_speedup is the bound when none is given."""
    from mcp_server import api
    from mcp_server.schema.analysis import Analysis, SpeedOfLight
    from mcp_server.schema.requests import Interpreter, ValidateRequest

    example = Analysis.model_validate_json((Path(__file__).resolve().parents[1] / "examples" / "conv_block"
                                            / "analysis.json").read_text())
    sol = SpeedOfLight(window_ns=6_000_000, window_source="test", floor_ns=4_000_000,
                       reduced_precision_floor_ns=3_000_000, launch_floor_ns=40_000, kernels_bounded=40,
                       kernels_at_measured_time=0, pct_of_speed_of_light=66.7, plausible_floor_ns=2_000_000,
                       max_plausible_speedup=3.0, estimate_label="estimate")
    analysis = tmp_path / "analysis.json"
    analysis.write_text(example.model_copy(update={"speed_of_light": sol}).model_dump_json())
    said: list[str] = []
    req = ValidateRequest(baseline=BASELINE, optimized=CORRECT, python=Interpreter(python=sys.executable), seeds=(0,),
                          run_tests=False,
                          speedup=3.5, analysis=analysis, output=tmp_path / "out", project=tmp_path)
    result = api.validate(req, said.append)
    assert result.max_plausible_speedup == 3.0
    assert "speedup_plausible" in result.failed_checks
    assert any("a speedup above 3.00x is suspect" in line for line in said)


def test_the_reduced_tier_holds_float32_outputs_to_its_stated_tolerance(tmp_path):
    """The same 1.01-scaled output fails the exact tier (rtol 1e-4) and passes the reduced one (1e-2); the fp8 tier
    holds every floating class to its 0.25."""
    report = validate(BASELINE, WORKLOADS / "tiny_mlp_wrong_numerics_optimized.py", seeds=(0,), run_tests=False,
                      tier="reduced")
    assert report.tier == "reduced" and report.tolerances["float32"] == 1e-2
    assert _check(report, "numerics").passed
    assert report.precision_note is not None and "held to the float32 class (rtol 0.01)" in report.precision_note
    assert "TF32 does not apply on the CPU" in report.precision_note, "cuDNN's flag is True on a CPU machine too"
    fp8 = validate(BASELINE, WORKLOADS / "tiny_mlp_wrong_numerics_optimized.py", seeds=(0,), run_tests=False,
                   tier="fp8")
    assert fp8.tier == "fp8" and _check(fp8, "numerics").passed
    assert {fp8.tolerances[c] for c in ("float32", "tf32", "bfloat16", "float16")} == {0.25}
    with pytest.raises(UsageError, match="precision tier"):
        validate(BASELINE, CORRECT, tier="fp4")


def test_an_exact_plan_refuses_a_precision_change():
    from pydantic import ValidationError
    from test_render import sample_plan

    from mcp_server.schema.optimizations import OptimizationPlan

    plan = sample_plan("examples/conv_block/conv_block.py").model_dump()
    plan["items"][0]["precision_change"] = True
    with pytest.raises(ValidationError, match="exact tier forbids"):
        OptimizationPlan.model_validate(plan)
    assert OptimizationPlan.model_validate({**plan, "tier": "reduced"}).tier == "reduced"
    plan["items"][0].update(pass_name="fp8_linear", pattern="knowledge/fx_patterns/fp8_linear.py")
    with pytest.raises(ValidationError, match="only the fp8 tier allows"):
        OptimizationPlan.model_validate({**plan, "tier": "reduced"})
    assert OptimizationPlan.model_validate({**plan, "tier": "fp8"}).tier == "fp8"


def test_each_implemented_item_must_fire_its_own_pass():
    """A configuration item's count cannot stand in for a graph rewrite that matched nothing."""
    from test_render import sample_plan

    from mcp_server.proof.validate import planned_passes_check

    plan = sample_plan("examples/conv_block/conv_block.py")  # item 1 implemented, item 2 (cuda_graphs) deferred
    assert planned_passes_check(plan, {"fuse_mul_add_to_addcmul": 2, "cuda_graphs": 1}).status == "pass"
    failed = planned_passes_check(plan, {"cuda_graphs": 1})
    assert failed.status == "fail" and "fuse_mul_add_to_addcmul" in failed.detail
    assert planned_passes_check(None, {}).status == "skip"


def test_the_reduced_tier_accepts_an_output_returned_in_bfloat16_and_the_exact_tier_does_not():
    """A float32 output returned in bfloat16 (as autocast returns it) is compared after upcasting in the reduced
    tier, with both dtypes reported; the exact tier fails shapes_dtypes."""
    half = WORKLOADS / "tiny_mlp_bf16_output_optimized.py"
    with ThreadPoolExecutor(max_workers=2) as pool:
        reduced_job = pool.submit(validate, BASELINE, half, python=sys.executable, seeds=(0,), run_tests=False,
                                  tier="reduced")
        exact_job = pool.submit(validate, BASELINE, half, python=sys.executable, seeds=(0,), run_tests=False)
    reduced, exact = reduced_job.result(), exact_job.result()
    assert reduced.passed, render_checks(reduced)
    shapes = _check(reduced, "shapes_dtypes")
    assert "out bfloat16 (baseline float32)" in shapes.detail
    outputs = _check(reduced, "numerics").outputs
    assert outputs and all(o.dtype == "torch.bfloat16" and o.baseline_dtype == "torch.float32" for o in outputs)
    assert all(o.max_rel_error is not None and 0 < o.max_rel_error <= 1e-2 for o in outputs)
    assert not exact.passed
    assert not _check(exact, "shapes_dtypes").passed
    assert "torch.bfloat16" in _check(exact, "shapes_dtypes").detail


def test_a_baseline_written_in_bfloat16_is_held_to_its_own_distance_from_fp32():
    """tiny_mlp_bf16 compiled (`compile+fp32`, still bfloat16) in the exact tier: its tolerances start from twice
    the baseline's largest relative error against itself in float32, measured by the child and said in the
    report's precision note; a baseline written in float32 keeps the fp32 defaults."""
    bf16 = WORKLOADS / "tiny_mlp_bf16.py"
    report = validate(bf16, WORKLOADS / "tiny_mlp_bf16_optimized.py", python=sys.executable, seeds=(0, 1),
                      run_tests=False)
    assert report.passed, render_checks(report)
    note = report.precision_note or ""
    assert "the baseline is written in bfloat16/float16 and is " in note and "from itself in float32" in note
    written = float(note.split(" and is ")[1].split(" from itself")[0])
    assert 0 < written < 5e-2
    assert report.tolerances["bfloat16"] == pytest.approx(max(1e-2, 2 * written), rel=0.06)  # 2 digits said
    assert report.tolerances["float32"] >= 2 * written * 0.99


def test_the_reduced_tier_accepts_one_half_precision_for_the_other():
    """A bfloat16 model cast to float16 returns float16 outputs: compared after upcasting in the reduced tier."""
    import torch

    from mcp_server.children.numerics import Checks, compare_leaf

    ref = torch.randn(64, dtype=torch.bfloat16)
    out = ref.to(torch.float16)
    for reduced, allowed in ((True, True), (False, False)):
        checks = Checks()
        compare_leaf("out", out, ref, 0, "a", {"rtol": 1e-2, "atol": None, "tolerances": {}, "tf32": False,
                                               "reduced": reduced}, checks)
        assert ("shapes_dtypes" not in checks.problems) is allowed


def test_measuring_a_half_precision_model_against_fp32_leaves_the_model_as_written():
    """A workload may hand out one model it keeps (a module-level global): the float32 twin is a copy."""
    import torch

    from mcp_server.children.numerics import written_error

    kept = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(torch.bfloat16)
    x = torch.randn(8, 16, dtype=torch.bfloat16)
    found = written_error(lambda seed: (kept, (x,)), [0, 1], {"rtol": 1e-2, "atol": None, "tolerances": {},
                                                             "tf32": False, "reduced": True})
    assert found is not None and len(found["outputs"]) == 2 and not found.get("failed")
    assert all(0 < o["max_rel_error"] < 5e-2 for o in found["outputs"])
    assert {p.dtype for p in kept.parameters()} == {torch.bfloat16} and x.dtype == torch.bfloat16
    assert written_error(lambda seed: (kept.float(), (x.float(),)), [0], {}) is None  # written in float32


def test_the_same_output_for_different_inputs_is_caching_only_where_the_baseline_tells_them_apart():
    """A copy of the first call's output fails output_caching (the baseline's outputs for the two inputs differ far
    beyond the tolerance); a bfloat16 cast of a model whose float32 outputs differ by less than the tolerance gives
    the same output for both and passes, said in a warning (mbconv_net.py's reduced-tier winner on an H200 failed
    validation this way: different inputs, the same float16 logits)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        copied_job = pool.submit(validate, BASELINE, WORKLOADS / "tiny_mlp_wrong_copied_optimized.py",
                                 python=sys.executable, seeds=(0,), run_tests=False)
        flat_job = pool.submit(validate, WORKLOADS / "insensitive.py", WORKLOADS / "insensitive_bf16_optimized.py",
                               python=sys.executable, seeds=(0, 1), run_tests=False, tier="reduced")
    copied, flat = copied_job.result(), flat_job.result()
    assert not copied.passed and "output_caching" in copied.failed_checks
    assert "different inputs gave the same output" in _check(copied, "output_caching").detail
    assert flat.passed, render_checks(flat)
    assert _check(flat, "output_caching").passed
    assert any("less than the tolerance" in w for w in flat.warnings)
