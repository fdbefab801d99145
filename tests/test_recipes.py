"""recipes: names, the plan (pure), tiers from errors, the GPU's turns, and real frontiers of tiny workloads on the
CPU (each recipe in its own process), through the CLI and the facade."""

from __future__ import annotations

import json
import lzma
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from fixtures_util import FIXTURES

from mcp_server.children.contract import CHANNELS_LAST, recipe_name, recipe_parts
from mcp_server.children.gpu_lock import GpuTurns
from mcp_server.cli import build_parser
from mcp_server.cli import main as cli
from mcp_server.errors import CancelledCapture
from mcp_server.proof.recipe_plan import (
    GPU_ONLY,
    MIXED_CONV,
    NO_CONV,
    NO_CONV2D,
    NOT_MODULE,
    THOROUGH_ONLY,
    WINNERS_ONLY,
    every_recipe,
    plan_first,
    plan_layout,
    recipe_code,
    skipped,
)
from mcp_server.proof.recipes import default_jobs, recipes, tail_warning, tier_of
from mcp_server.schema.recipes import ModelFacts, ProcessTimes, RecipeError, RecipesReport
from mcp_server.schema.requests import Interpreter, RecipesRequest, RecipeTiming

WORKLOADS = Path(__file__).resolve().parent / "workloads"
FAST = RecipeTiming(warmup=2, calls=12, queued=12, blocks=2, budget_s=0.2, input_sets=2)
CONV = ModelFacts(is_module=True, has_convolution=True, parameters=10, parameter_dtypes=["float32"],
                  floating_inputs=1, input_shapes=[[1, 3, 8, 8]])
MLP = CONV.model_copy(update={"has_convolution": False})
FUNCTION = MLP.model_copy(update={"is_module": False})


def test_a_recipe_name_reads_back_in_canonical_order():
    assert recipe_parts("channels-last+bf16-cast+reduce-overhead") == ("reduce-overhead", "bf16-cast",
                                                                        "channels-last", False)
    assert recipe_name(*recipe_parts("compile")) == "compile+fp32"
    assert recipe_name(*recipe_parts("channels-last-3d+compile")) == "compile+fp32+channels-last-3d"
    for wrong, why in (("inductor", "unknown recipe part"), ("eager+compile", "2 compile modes"),
                       ("eager+tf32+bf16-cast", "2 precisions"), ("eager+channels-last+channels-last-3d", "2 layouts")):
        with pytest.raises(ValueError, match=why):
            recipe_parts(wrong)


def test_only_takes_recipes_from_repeated_flags_and_from_commas():
    """`--only eager+bf16-cast,eager+bf16-autocast` read as one unknown recipe 'bf16-cast,eager'; both spellings
    work."""
    args = ["recipes", "w.py", "--only", "eager+bf16-cast,eager+bf16-autocast", "--only", "channels-last+compile"]
    parsed = build_parser().parse_args(args)
    request = RecipesRequest(workload=REPO / "tests" / "workloads" / "tiny_mlp.py",
                             python=Interpreter(python=sys.executable), only=tuple(parsed.only), project=REPO)
    assert request.only == ("eager+bf16-cast", "eager+bf16-autocast", "compile+fp32+channels-last")


def test_the_default_gpu_frontier_of_a_conv_model_is_every_mode_and_precision_then_layouts_on_the_winners():
    first = plan_first(True, CONV, thorough=False)
    assert len(first) == 3 * 6 - 1 and all(stage == "precision" for _, stage in first)
    assert [r for r, _ in first][0].startswith("reduce-overhead")  # longest compiles first
    layout = plan_layout(True, CONV, ["eager+fp32", "reduce-overhead+fp16-cast"], thorough=False, already=set())
    assert [r for r, _ in layout] == [
        "eager+fp32+channels-last", "eager+fp32+cudnn-benchmark", "eager+fp32+channels-last+cudnn-benchmark",
        "reduce-overhead+fp16-cast+channels-last", "reduce-overhead+fp16-cast+cudnn-benchmark",
        "reduce-overhead+fp16-cast+channels-last+cudnn-benchmark"]
    assert plan_layout(True, MLP, ["eager+fp32"], thorough=False, already=set()) == []


def test_a_model_whose_convolutions_are_1d_gets_the_autotuner_but_not_channels_last():
    """channels_last lays out 4-d tensors: with only Conv1d (an audio encoder's) it changes nothing."""
    conv1d = CONV.model_copy(update={"has_conv2d": False})
    layout = plan_layout(True, conv1d, ["reduce-overhead+fp16-cast"], thorough=False, already=set())
    assert [r for r, _ in layout] == ["reduce-overhead+fp16-cast+cudnn-benchmark"]
    assert not any(recipe_parts(r)[2] for r, _ in plan_first(True, conv1d, thorough=True))
    groups = {g.reason: g.recipes for g in skipped(True, conv1d, True, (), {"eager+fp32"})}
    assert all(recipe_parts(r)[2] for r in groups[NO_CONV2D])
    assert "eager+fp32+channels-last" in groups[NO_CONV2D]
    assert plan_layout(False, conv1d, ["eager+fp32"], thorough=False, already=set()) == []
    before = CONV.model_copy(update={"has_conv2d": None})  # a recipes.json without the field: as has_convolution
    assert plan_layout(True, before, ["eager+fp32"], False, set()) == plan_layout(True, CONV, ["eager+fp32"], False,
                                                                                  set())


def test_a_model_whose_convolutions_are_3d_gets_channels_last_3d_and_one_with_both_no_layout():
    """channels_last_3d lays out the 5-d tensors of 3-D convolutions (a video model's); a model with 2-D and 3-D
    convolutions has no one memory format for both."""
    conv3d = CONV.model_copy(update={"has_conv2d": False, "has_conv3d": True})
    layout = plan_layout(True, conv3d, ["reduce-overhead+fp16-cast"], thorough=False, already=set())
    assert [r for r, _ in layout] == ["reduce-overhead+fp16-cast+channels-last-3d",
                                      "reduce-overhead+fp16-cast+cudnn-benchmark",
                                      "reduce-overhead+fp16-cast+channels-last-3d+cudnn-benchmark"]
    assert {recipe_parts(r)[2] for r, _ in plan_first(True, conv3d, thorough=True)} == {"", "channels-last-3d"}
    assert [r for r, _ in plan_layout(False, conv3d, ["eager+fp32"], False, set())] == ["eager+fp32+channels-last-3d"]
    assert not any("channels-last" in r for g in skipped(True, CONV, True, (), {"eager+fp32"}) for r in g.recipes
                   if "3d" in r)  # a 2-D model is not told of a layout it has no use for
    mixed = conv3d.model_copy(update={"has_conv2d": True})
    assert [r for r, _ in plan_layout(True, mixed, ["eager+fp32"], False, set())] == ["eager+fp32+cudnn-benchmark"]
    groups = {g.reason: g.recipes for g in skipped(True, mixed, True, (), {"eager+fp32"})}
    assert "eager+fp32+channels-last" in groups[MIXED_CONV]


def test_the_pasted_lines_of_channels_last_3d_convert_a_video_model_and_its_clips():
    import torch

    from mcp_server.children.recipe import apply

    lines = recipe_code("eager+fp32+channels-last-3d", "cpu")
    assert "model = model.to(memory_format=torch.channels_last_3d)" in lines
    model = torch.nn.Conv3d(3, 4, 3)
    clip = torch.randn(2, 3, 4, 8, 8)
    namespace = {"torch": torch, "model": model, "inputs": (clip, torch.randn(2, 3, 8, 8))}
    exec("\n".join(lines[:-1]), namespace)  # every line but the call
    converted, image = namespace["inputs"]
    assert converted.is_contiguous(memory_format=torch.channels_last_3d) and image.is_contiguous()  # 5-d only
    assert model.weight.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(model(converted), torch.nn.functional.conv3d(clip, model.weight, model.bias))
    applied = apply(torch.nn.Conv3d(3, 4, 3), "compile+fp32+channels-last-3d", "cpu")  # what `recipes` runs
    (prepared,) = applied.prepare((clip,))
    assert prepared.is_contiguous(memory_format=torch.channels_last_3d)


def test_the_plan_leaves_out_what_does_not_apply_and_says_why():
    assert not any(recipe_parts(r)[1].endswith("-cast") for r, _ in plan_first(True, FUNCTION, thorough=False))
    cpu = [r for r, _ in plan_first(False, MLP, thorough=False)]
    assert sorted(cpu) == sorted(["eager+bf16-autocast", "eager+bf16-cast", "compile+fp32", "compile+bf16-autocast",
                                  "compile+bf16-cast"])
    ran = {"eager+fp32", *cpu}
    groups = {g.reason: g.recipes for g in skipped(False, MLP, False, (), ran)}
    assert set(groups) == {GPU_ONLY, NO_CONV}
    assert sum(map(len, groups.values())) + len(ran) == len(every_recipe(True, CHANNELS_LAST, True))
    gpu_groups = {g.reason for g in skipped(True, CONV, False, (), {"eager+fp32"})}
    assert {THOROUGH_ONLY, WINNERS_ONLY} <= gpu_groups
    assert NOT_MODULE in {g.reason for g in skipped(True, FUNCTION, False, (), {"eager+fp32"})}
    assert len(plan_first(True, CONV, thorough=True)) == len(every_recipe(True, CHANNELS_LAST, True)) - 1


def test_the_lines_of_a_recipe_are_what_it_runs():
    lines = recipe_code("reduce-overhead+fp16-cast+channels-last+cudnn-benchmark", "cuda")
    assert "torch.backends.cudnn.benchmark = True" in lines and "model = model.to(torch.float16)" in lines
    assert 'model = torch.compile(model, mode="reduce-overhead")' in lines and lines[-1] == "out = model(*inputs)"
    autocast = recipe_code("compile+bf16-autocast", "cpu")
    assert autocast[-2:] == ['with torch.autocast("cpu", dtype=torch.bfloat16):', "    out = model(*inputs)"]
    assert not any("tf32" in line for line in autocast)  # no TF32 flag on the CPU



def test_the_pasted_lines_of_a_cast_recipe_convert_inputs_nested_in_lists_and_dicts():
    import torch

    lines = recipe_code("eager+bf16-cast+channels-last", "cpu")
    model = torch.nn.Conv2d(3, 4, 1)
    namespace = {"torch": torch, "model": model, "inputs": ([torch.randn(2, 3, 8, 8)], {"scale": torch.randn(1)}, 3)}
    exec("\n".join(lines[:-1]), namespace)  # every line but the call
    (image,), extra, count = namespace["inputs"]
    assert image.dtype == torch.bfloat16 and image.is_contiguous(memory_format=torch.channels_last)
    assert extra["scale"].dtype == torch.bfloat16 and count == 3

def test_a_tier_is_the_tightest_tolerance_the_error_meets():
    def error(worst: float, problems: tuple[str, ...] = ()) -> RecipeError:
        return RecipeError(seeds=[0], outputs_compared=1, max_rel_error=worst, problems=list(problems))

    assert tier_of("compile+fp32", error(5e-6)) == "exact"
    assert tier_of("compile+fp32", error(5e-4)) == "reduced"  # fp32 that drifted past float32's tolerance
    assert tier_of("compile+tf32", error(1e-5)) == "reduced"  # TF32 is never exact, however close
    assert tier_of("eager+bf16-cast", error(2e-2)) == "fp8"  # past the reduced tier's 1e-2, within the fp8 tier's
    assert tier_of("eager+bf16-cast", error(0.3)) is None
    assert tier_of("eager+fp32", error(0.0, ("seed 0, out: NaN",))) is None
    assert tier_of("eager+fp32", RecipeError(seeds=[0], outputs_compared=0)) is None


def test_jobs_by_device_and_cpus():
    assert default_jobs("cpu", 64) == 1 and default_jobs("cuda", 16) == 3 and default_jobs("cuda", 4) == 1
    assert default_jobs("cuda", 128) == 4


def test_a_waiting_window_goes_before_a_warm_up_that_starts_after_it(tmp_path):
    """GpuTurns: a process warming up holds the GPU shared; a window waiting for it is served before another process
    that asks to warm up later (no stream of compiles starves a window)."""
    lock = tmp_path / "gpu.lock"
    events: list[str] = []
    first, window, late = GpuTurns(lock), GpuTurns(lock), GpuTurns(lock)
    first.shared()

    def measure() -> None:
        window.exclusive()
        events.append("window")
        time.sleep(0.2)
        window.release()

    def warm_up() -> None:
        late.shared()
        events.append("late warm-up")
        late.release()

    threads = [threading.Thread(target=measure)]
    threads[0].start()
    time.sleep(0.2)  # the window now waits for `first`
    threads.append(threading.Thread(target=warm_up))
    threads[1].start()
    time.sleep(0.2)
    assert events == []  # neither may go while `first` warms up
    first.release()
    for thread in threads:
        thread.join(5)
    assert events == ["window", "late warm-up"]


@pytest.mark.slow
def test_a_frontier_records_crashes_hangs_and_failed_validation_and_is_not_fatal(tmp_path):
    stale = tmp_path / "recipe_logs" / "compile_fp32.log"  # a previous frontier's failure, in the same folder
    stale.parent.mkdir()
    stale.write_text("an earlier failure")
    report = recipes(WORKLOADS / "recipe_hostile.py", python=sys.executable, options=FAST, seeds=(0, 1),
                     only=("eager+bf16-autocast", "eager+bf16-cast", "compile+fp32"), out_dir=tmp_path, timeout_s=20)
    by = {r.recipe: r for r in report.results}
    assert by["eager+fp32"].tier == "exact" and by["eager+fp32"].stage == "reference"
    crashed = by["eager+bf16-autocast"]
    assert crashed.status == "failed" and "refuses autocast" in (crashed.reason or "")
    assert by["eager+bf16-cast"].status == "timed_out"
    assert by["compile+fp32"].status == "ok" and by["compile+fp32"].tier == "exact"
    assert (tmp_path / "recipe_logs" / "eager_bf16-autocast.log").is_file()  # the failed recipe's log is kept
    assert not stale.exists()
    assert report.winner("exact") is not None and report.winner("reduced") is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe_logs", "recipes.json"]
    assert RecipesReport.model_validate_json((tmp_path / "recipes.json").read_text()) == report


def test_a_cancelled_frontier_keeps_the_recipes_that_ended_before_it(tmp_path):
    """The facade's cancel (an MCP client's cancellation) after the first recipe: recipes.json keeps the reference and
    that recipe, says it was stopped, and names the recipe the cancel stopped as not run."""
    cancel = threading.Event()

    def progress(line: str) -> None:
        if "recipes: [1/" in line:
            cancel.set()

    with pytest.raises(CancelledCapture):
        recipes(WORKLOADS / "tiny_mlp.py", python=sys.executable, options=FAST, seeds=(0,), jobs=1,
                only=("eager+bf16-autocast", "eager+bf16-cast"), out_dir=tmp_path, progress=progress, cancel=cancel)
    report = RecipesReport.model_validate_json((tmp_path / "recipes.json").read_text())
    assert sorted(r.recipe for r in report.results) == ["eager+bf16-autocast", "eager+fp32"]
    assert report.stopped is not None and report.stopped.endswith("after 1 recipe(s)")
    assert [g.recipes for g in report.skipped if g.reason.startswith("not run: the run was stopped")] == [
        ["eager+bf16-cast"]]


@pytest.mark.slow
def test_the_cli_measures_a_cpu_frontier_and_prints_each_tiers_winner_with_its_lines(tmp_path, capsys):
    code = cli(["recipes", str(WORKLOADS / "recipe_hostile.py"), "--only", "eager+bf16-autocast", "--seeds", "0",
                "--budget-s", "0.2", "--warmup", "2", "--output", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "exact tier winner by latency: eager+fp32" in out and "    out = model(*inputs)" in out
    assert "eager+bf16-autocast" in out and "failed: " in out
    assert (tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((tmp_path / "recipes.json").read_text())
    assert report["device_type"] == "cpu" and report["seeds"] == [0]


@pytest.mark.slow
def test_bf16_that_loses_the_output_fails_validation_for_every_tier(tmp_path):
    report = recipes(WORKLOADS / "cancellation.py", python=sys.executable, options=FAST, seeds=(0, 1),
                     only=("eager+bf16-cast",), out_dir=tmp_path)
    lost = report.result("eager+bf16-cast")
    assert lost is not None and lost.status == "ok" and lost.error is not None
    assert lost.tier is None and (lost.error.max_rel_error or 0) > 1e-2 and lost.error.outputs_compared == 2
    assert report.winner("reduced") is not None and report.winner("reduced").recipe == "eager+fp32"
    assert report.pareto == ["eager+fp32"]  # a recipe that failed validation is on no front


def test_a_frontier_failed_by_a_few_flipped_elements_says_so() -> None:
    """The own MoE's frontier recorded on an H200 (scripts/gpu_workloads/moe_topk.py): every reduced recipe failed the
    tiers because lower precision flips a few tokens' top-2 experts (p99 of relative error 1.2e-3, the worst 1.8);
    the examples' frontiers, whose failures are not in a few elements, say nothing."""
    moe = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_moe_topk_recipes.json.xz").read_bytes()))
    (warning,) = tail_warning(moe.results)
    assert warning.startswith("9 recipe(s) failed every tier in a few elements only (99 % of elements within 1.2e-03")
    assert "top-k routing" in warning
    for example in sorted((REPO / "examples").glob("*/recipes.json")):
        assert tail_warning(RecipesReport.model_validate_json(example.read_text()).results) == [], example


def test_a_model_written_in_bfloat16_is_the_reference_in_bfloat16_not_fp32_eager(tmp_path):
    """Its `eager+fp32` runs the model as written: what the frontier's speedups and errors are against is said so."""
    from mcp_server.render.frontier import format_recipes
    from mcp_server.render.recipe_workload import recipe_workload

    report = recipes(WORKLOADS / "tiny_mlp_bf16.py", python=sys.executable, options=FAST, seeds=(0,),
                     only=("eager+bf16-cast",), out_dir=tmp_path)
    assert report.model is not None and report.model.parameter_dtypes == ["bfloat16"]
    assert report.model.written_precision == "bfloat16" and report.reference_label == "eager as written in bfloat16"
    cast = report.result("eager+bf16-cast")
    assert cast is not None and cast.error is not None and cast.error.max_rel_error == 0.0  # a cast to what it is
    table = format_recipes(report)
    assert "errors against eager+fp32 (eager as written in bfloat16: fp32 in a recipe's name keeps the model's own " \
           "precision)" in table
    assert "x fp32 eager" not in table and "x eager as written in bfloat16" in table
    winner = report.winner("reduced")
    assert winner is not None
    source = recipe_workload(WORKLOADS / "tiny_mlp_bf16.py", winner, report, tmp_path / "recipes.json")
    assert "against eager as written in bfloat16" in source and "fp32 eager" not in source
    assert MLP.written_precision == "fp32"
    # the reference measured against itself in float32: each tier's tolerance starts from twice its largest error
    written = report.written_error
    assert written is not None and written.outputs_compared == 1 and 0 < (written.max_rel_error or 0) < 5e-2
    assert f"every tier's tolerance is at least twice that, {2 * written.max_rel_error:.2g}" in table


def test_a_model_written_below_fp32_sorts_recipes_by_its_own_distance_from_fp32():
    """On an H200 a 4-block bfloat16 decoder compiled by Inductor was 3.1e-2 from itself in eager (the largest of
    8.4M logits, p99 1.1e-2): bfloat16's rounding in another order, not a precision lowered. Against a model
    written in fp32 that would be the fp8 tier's; against one written in bfloat16, whose own distance from fp32 is
    of that size, it is as exact as the model is."""
    from mcp_server.proof.recipes import tier_floor

    compiled = RecipeError(seeds=[0], outputs_compared=1, max_rel_error=3.1e-2)
    written = RecipeError(seeds=[0], outputs_compared=1, max_rel_error=2.0e-2)
    assert tier_of("reduce-overhead+fp32", compiled) == "fp8"
    assert tier_floor(written) == 4.0e-2 and tier_floor(None) == 0.0
    assert tier_of("reduce-overhead+fp32", compiled, written) == "exact"
    assert tier_of("reduce-overhead+fp16-cast", compiled, written) == "reduced"  # a cast is never exact
    far = RecipeError(seeds=[0], outputs_compared=1, max_rel_error=0.3)
    assert tier_of("reduce-overhead+fp32", far, written) is None


def test_a_bfloat16_decoders_frontier_on_the_gpu_is_sorted_by_its_own_distance_from_fp32():
    """scripts/gpu_workloads/decoder_bf16.py's frontier on an H200 (`operator-profiler optimize --tier exact`,
    2026-11-29; recorded under the name bf16_lm.py, the same model before it was kept there): eager as written is
    2.8e-2 from itself in float32 at most, so its compiled recipes (3.1e-2 from it, bfloat16 rounding in another
    order) are exact, and reduce-overhead wins the exact tier; its float16 casts are compared after upcasting instead
    of failing on their output dtype."""
    report = RecipesReport.model_validate_json(
        lzma.decompress((FIXTURES / "h200_decoder_bf16_recipes.json.xz").read_bytes()))
    written = report.written_error
    assert report.model is not None and report.model.parameter_dtypes == ["bfloat16"]
    assert written is not None and 2.5e-2 < (written.max_rel_error or 0) < 3e-2
    for result in report.results:
        if result.status == "ok" and result.error is not None:
            assert result.tier == tier_of(result.recipe, result.error, written), result.recipe
    compiled = report.result("reduce-overhead+fp32")
    assert compiled is not None and compiled.error is not None and compiled.tier == "exact"
    assert tier_of(compiled.recipe, compiled.error) == "fp8"  # against fp32's tolerance, as a fp32 model is held
    winner = report.winner("exact")
    assert winner is not None and winner.recipe == "reduce-overhead+fp32"
    eager = report.result("eager+fp32")
    assert eager is not None and winner.time_ns < eager.time_ns("latency") / 2
    casts = [r for r in report.results if r.recipe.endswith("fp16-cast")]
    assert casts and all(r.tier == "reduced" and r.error is not None and not r.error.problems for r in casts)


def test_a_half_precision_model_that_cannot_run_in_fp32_keeps_the_tiers_tolerances_and_says_why(tmp_path):
    report = recipes(WORKLOADS / "tiny_mlp_bf16_only.py", python=sys.executable, options=FAST, seeds=(0,),
                     only=("eager+bf16-cast",), out_dir=tmp_path)
    assert report.written_error is not None and report.written_error.outputs_compared == 0
    [said] = [w for w in report.warnings if "did not run in float32" in w]
    assert "TypeError: this kernel takes bfloat16 only, not torch.float32" in said
    reference = report.result("eager+fp32")
    assert reference is not None and reference.tier == "exact"


def test_a_winner_the_frontier_cannot_tell_from_its_runner_up_says_so():
    """The DLRM-style recommender's H200 frontier (tests/fixtures/h200_dlrm_recipes.json.xz): compile+fp16-cast won
    the reduced tier in its one process at 588.9 µs, eager+fp16-cast 595.6 µs; bench later measured the winner's
    processes at 588.7 to 1128.1 µs. The winner's lines are followed by the close runner-up and how to tell them
    apart; a tier whose runner-up is further than the spread says nothing."""
    from mcp_server.proof.stats import PROCESS_SPREAD
    from mcp_server.render.frontier import format_recipes, runner_up

    report = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_dlrm_recipes.json.xz").read_bytes()))
    close = runner_up(report, "reduced")
    assert close is not None and close.recipe == "eager+fp16-cast"
    table = format_recipes(report)
    assert ("    (close behind it: eager+fp16-cast measured 595.6 µs by latency in its own process, within the "
            f"{PROCESS_SPREAD:.2f}× by which the processes of one host-bound recipe can differ: one process each does "
            "not tell the two apart (`recipes --runoff 2` runs each again, or `bench` the two))") in table
    far = report.model_copy(update={"results": [r for r in report.results if r.tier != "reduced"
                                                or r.recipe == "compile+fp16-cast"]})
    assert runner_up(far, "reduced") is None  # the exact tier's fastest, 724.3 µs, is beyond the spread


def _with_runoff(report: RecipesReport, medians: dict[str, list[float]]) -> RecipesReport:
    """`report` as if the runoff had run `medians` (latency, ns) for the recipes named: more processes each."""
    results = [r.model_copy(update={"runoff": [ProcessTimes(latency_ns=m, back_to_back_ns=m, wall_time_s=1.0)
                                               for m in medians.get(r.recipe, [])]}) for r in report.results]
    return report.model_copy(update={"results": results, "runoff_rounds": 2})


def test_the_runoff_takes_each_tiers_winner_and_the_recipes_within_the_spread_of_it():
    """The DLRM-style recommender's H200 frontier: the reduced tier's winner compile+fp16-cast (588.9 µs) has
    eager+fp16-cast within 1.15x of it; the runoff of every tier takes each tier's race (winner first, at most
    RUNOFF_MAX), that of one tier only its own."""
    from mcp_server.proof.recipes import RUNOFF_MAX, contenders
    from mcp_server.proof.stats import PROCESS_SPREAD

    report = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_dlrm_recipes.json.xz").read_bytes()))
    named = contenders(report.results, "latency")
    reduced = [r for r in sorted(report.results, key=lambda r: r.time_ns("latency") or float("inf"))
               if r.status == "ok" and r.tier in ("exact", "reduced")]
    best = reduced[0].time_ns("latency") or 0.0
    close = [r.recipe for r in reduced if (r.time_ns("latency") or 0.0) <= best * PROCESS_SPREAD][:RUNOFF_MAX]
    assert close == ["compile+fp16-cast", "eager+fp16-cast"]
    # every tier's race: the fp8 tier's reduce-overhead+bf16-cast (540.7 µs) and the exact tier's two fp32 recipes
    assert named == ["reduce-overhead+fp32", "eager+fp32", "compile+fp16-cast", "eager+fp16-cast",
                     "reduce-overhead+bf16-cast"]
    assert contenders(report.results, "latency", ("reduced",)) == close  # optimize --tier reduced: its race alone
    alone = [r for r in report.results if r.recipe not in close[1:]]
    assert "compile+fp16-cast" not in contenders(alone, "latency", ("reduced",))  # no recipe near it: no race


def test_after_a_runoff_the_runner_up_says_whether_its_processes_tell_it_from_the_winner():
    """The same frontier, the runoff's processes added by hand: a runner-up slower in every process says so; one
    whose processes overlap the winner's says the race is not settled. Times are medians of process medians."""
    from mcp_server.render.frontier import format_recipes, runner_up_text

    report = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_dlrm_recipes.json.xz").read_bytes()))
    apart = _with_runoff(report, {"compile+fp16-cast": [590_000.0, 1_100_000.0], "eager+fp16-cast": [600_000.0,
                                                                                                      610_000.0]})
    winner = apart.result("compile+fp16-cast")
    assert winner is not None and winner.time_ns("latency") == 590_000.0  # the median of 588.9, 590 and 1100 µs
    assert runner_up_text(apart, "reduced") == (
        "eager+fp16-cast measured 600.0 µs by latency, the median of 3 processes (595.6–610.0 µs; the winner's 3: "
        "588.9–1100.0 µs): their processes overlap, so which of the two is faster is not settled (`bench` them with "
        "more --rounds)")
    slower = _with_runoff(report, {"compile+fp16-cast": [590_000.0, 591_000.0], "eager+fp16-cast": [600_000.0,
                                                                                                     610_000.0]})
    said = runner_up_text(slower, "reduced")
    assert said is not None and said.endswith("595.6–610.0 µs; the winner's 3: 588.9–591.0 µs): slower than the "
                                              "winner in every process")
    changed = slower.model_copy(update={"runoff_changed": ["reduced (latency): eager+fp16-cast -> compile+fp16-cast"]})
    assert ("runoff: 2 more process(es) each for compile+fp16-cast, eager+fp16-cast (within 1.15x of the winner); "
            "their times are the medians of their processes' medians; it changed reduced (latency): eager+fp16-cast "
            "-> compile+fp16-cast") in format_recipes(changed)


def test_a_host_bound_frontier_runs_its_close_recipes_again_and_ranks_them_by_their_processes(tmp_path):
    """A forward that waits a fixed 5 ms on the host (CPU): eager+fp32 and eager+bf16-cast both run in about that,
    so the reduced tier's race goes to the runoff: one more process each, timed only, their times the medians
    of their processes' medians; the exact tier, one recipe, has none."""
    lines: list[str] = []
    report = recipes(WORKLOADS / "host_bound.py", python=sys.executable, options=FAST, seeds=(0,),
                     only=("eager+bf16-cast",), out_dir=tmp_path, progress=lines.append, runoff=1)
    by = {r.recipe: r for r in report.results}
    assert by["eager+bf16-cast"].tier == "reduced" and by["eager+fp32"].tier == "exact"
    for result in by.values():
        assert len(result.runoff) == 1 and result.runoff[0].latency_ns > 5e6  # the wait is in it
        medians = result.process_medians("latency")
        assert len(medians) == 2 and result.time_ns("latency") == statistics.median(medians)
    assert report.runoff_rounds == 1
    assert any(line.startswith("recipes: runoff of eager+fp32, eager+bf16-cast: within 1.15x") or
               line.startswith("recipes: runoff of eager+bf16-cast, eager+fp32: within 1.15x") for line in lines)
    winner = report.winner("reduced")
    assert winner is not None and winner.time_ns == by[winner.recipe].time_ns("latency")
    saved = RecipesReport.model_validate_json((tmp_path / "recipes.json").read_text())
    assert saved == report and saved.recipes_version == "1.4"


def test_a_runoff_of_one_tier_names_what_its_new_times_bring_into_the_race_and_changes_no_other_tier():
    """The Mamba-style SSM's H200 frontier through `optimize --tier reduced` (tests/fixtures/h200_ssm_recipes.json.xz,
    recorded before these rules): the reduced tier's winner reduce-overhead+fp16-cast measured 147.2 µs in its first
    process, 173.1 and 228.8 in the runoff's. Its median, 173.1 µs, brings reduce-overhead+fp16-cast+channels-last
    (178.3 µs, one process) within 1.15x: the race now names it. The fp8 tier's winner moved to
    reduce-overhead+bf16-cast (149.6 µs, one process) because a recipe it shares with the reduced tier was measured
    again: no change the reduced tier's runoff made, so it is not reported as one."""
    from mcp_server.proof.recipes import _changed, contenders
    from mcp_server.render.frontier import format_recipes, runner_up_text

    report = RecipesReport.model_validate_json(lzma.decompress((FIXTURES / "h200_ssm_recipes.json.xz").read_bytes()))
    winner = report.result("reduce-overhead+fp16-cast")
    assert winner is not None and winner.process_medians("latency") == [147152.0, 173136.0, 228816.0]
    assert contenders(report.results, "latency", ("reduced",)) == [
        "reduce-overhead+fp16-cast", "reduce-overhead+fp16-cast+channels-last"]
    assert _changed(report.results, "latency", ("reduced",)) == []
    assert _changed(report.results, "latency", ("reduced", "fp8")) == [
        "fp8 (latency): reduce-overhead+fp16-cast -> reduce-overhead+bf16-cast"]
    assert runner_up_text(report, "reduced") == (
        "reduce-overhead+fp16-cast+channels-last measured 178.3 µs by latency in 1 process(es), the winner "
        "147.2–228.8 µs in 3: within the 1.15× by which the processes of one host-bound recipe can differ, and not "
        "raced against it (`bench` the two to tell them apart)")
    raced = report.model_copy(update={"runoff_tiers": ["reduced"], "runoff_changed": []})
    assert ("runoff of the reduced tier's race: 2 more process(es) each for reduce-overhead+fp16-cast, "
            "reduce-overhead+fp16-autocast, reduce-overhead+tf32 (within 1.15x of the winner); their times are the "
            "medians of their processes' medians; no winner changed") in format_recipes(raced)


def test_a_runoff_on_the_gpu_tells_a_decided_race_from_an_open_one():
    """The DLRM-style recommender's frontier with `--runoff 2` on an H200 (tests/fixtures/h200_dlrm_runoff_recipes.
    json.xz, 130 s, every tier raced): the reduced tier's winner reduce-overhead+fp16-cast ran 531.3–534.7 µs in its
    three processes, eager+fp16-cast 596.3–603.1 µs: slower in every process, a decided race. The exact tier's
    eager+fp32 (765.9–805.3 µs) and reduce-overhead+fp32 (732.2–855.0 µs) overlap: the runoff moved the winner from
    reduce-overhead+fp32, whose one process had been the fastest, and says the race is still open."""
    from mcp_server.render.frontier import format_recipes, runner_up_text

    report = RecipesReport.model_validate_json(
        lzma.decompress((FIXTURES / "h200_dlrm_runoff_recipes.json.xz").read_bytes()))
    assert report.runoff_tiers == ["exact", "reduced", "fp8"] and report.runoff_rounds == 2
    assert report.runoff_changed == ["exact (latency): reduce-overhead+fp32 -> eager+fp32"]
    reduced = runner_up_text(report, "reduced")
    assert reduced is not None and reduced.startswith("eager+fp16-cast measured 597.6 µs by latency, the median of 3")
    assert reduced.endswith("slower than the winner in every process")
    exact = runner_up_text(report, "exact")
    assert exact is not None and exact.startswith("reduce-overhead+fp32 measured 776.0 µs")
    assert "their processes overlap, so which of the two is faster is not settled" in exact
    winner = report.winner("exact")
    assert winner is not None and winner.recipe == "eager+fp32" and winner.time_ns == 770064.0  # 770.1 µs
    assert "runoff of the exact, reduced and fp8 tiers' races: 2 more process(es) each" in format_recipes(report)


def test_a_recipe_that_dynamo_refuses_names_the_error_inside_dynamos_explanation_on_one_line():
    import torch

    from mcp_server.children.common import refusal

    def spectrum(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft2(x).abs()

    with pytest.raises(Exception) as raised:  # noqa: PT011 - Dynamo's own exception type, whatever its version
        torch.compile(spectrum, backend="eager")(torch.randn(2, 8, 8, dtype=torch.bfloat16))
    assert len(str(raised.value).splitlines()) > 1  # Dynamo explains over many lines
    line = refusal(raised.value, 300)
    assert "\n" not in line and line.endswith("RuntimeError('Unsupported dtype BFloat16')")


def test_the_pasted_lines_call_the_model_with_its_inputs_as_the_workload_returns_them():
    assert recipe_code("compile+fp32", "cpu", "dict")[-1] == "out = model(**inputs)"
    assert recipe_code("eager+bf16-autocast", "cpu", "dict")[-1] == "    out = model(**inputs)"
    assert recipe_code("compile+fp32", "cpu", "tensor")[-1] == "out = model(inputs)"
    assert recipe_code("compile+fp32", "cpu")[-1] == "out = model(*inputs)"


def test_the_model_facts_say_how_the_inputs_come():
    import torch

    from mcp_server.children.recipe import model_facts

    model = torch.nn.Linear(4, 4)
    assert ModelFacts.model_validate(model_facts(model, {"x": torch.randn(2, 4)})).inputs_form == "dict"
    assert ModelFacts.model_validate(model_facts(model, (torch.randn(2, 4),))).inputs_form == "tuple"
    assert ModelFacts.model_validate(model_facts(model, torch.randn(2, 4))).inputs_form == "tensor"


def test_a_reference_that_does_not_reproduce_itself_is_named_with_its_cause_and_optimize_refuses_it(tmp_path,
                                                                                                    capsys):
    """A model left in training mode: fp32 eager against another run of itself differs through its dropout, so no
    recipe validates in any tier. The frontier says why and how to fix it, and optimize refuses before profiling."""
    workload = WORKLOADS / "dropout_training.py"
    report = recipes(workload, python=sys.executable, options=FAST, seeds=(0,), only=("eager+bf16-autocast",),
                     out_dir=tmp_path, timeout_s=120)
    assert report.model is not None and report.model.dropout_in_training == ["2"]
    assert report.winner("exact") is None
    [unstable] = [w for w in report.warnings if w.startswith("eager+fp32, the reference, does not reproduce")]
    assert unstable.endswith("its model is in training mode with dropout active (2): return model.eval() from "
                             "get_model_and_input()")
    out = tmp_path / "floor"
    assert cli(["optimize", str(workload), "--recipes", str(tmp_path / "recipes.json"), "-o", str(out)]) == 1
    said = capsys.readouterr()
    assert "validated in the exact tier: eager+fp32, the reference, does not reproduce" in said.err + said.out
    assert not out.exists()


def test_a_model_that_changes_its_inputs_in_place_is_compared_on_inputs_it_has_not_changed(tmp_path):
    """The reference ran on the inputs the recipe then took: a model doubling its input in place made every recipe,
    the reference itself included, fail validation by a factor of two."""
    report = recipes(WORKLOADS / "mutates_input.py", python=sys.executable, options=FAST, seeds=(0, 1),
                     only=("compile+fp32",), out_dir=tmp_path, timeout_s=120)
    by = {r.recipe: r for r in report.results}
    assert by["eager+fp32"].tier == "exact" and by["compile+fp32"].tier == "exact"
    assert not any("does not reproduce" in w for w in report.warnings)


def test_the_model_facts_tell_2d_convolutions_from_others():
    """channels_last applies to 2-D convolutions (transposed ones too), channels_last_3d to 3-D ones; cuDNN's
    autotuner to any."""
    import torch

    from mcp_server.children.recipe import model_facts

    def facts(model: torch.nn.Module) -> ModelFacts:
        return ModelFacts.model_validate(model_facts(model, (torch.randn(1, 2, 8),)))

    one_d = facts(torch.nn.Sequential(torch.nn.Conv1d(2, 2, 3), torch.nn.Conv3d(2, 2, 1)))
    assert one_d.has_convolution and one_d.has_conv2d is False and one_d.has_conv3d is True
    assert facts(torch.nn.ConvTranspose2d(2, 2, 3)).has_conv2d is True
    assert facts(torch.nn.ConvTranspose2d(2, 2, 3)).has_conv3d is False
    assert facts(torch.nn.ConvTranspose3d(2, 2, 3)).has_conv3d is True
    assert facts(torch.nn.Linear(8, 8)).has_conv2d is False and not facts(torch.nn.Linear(8, 8)).has_convolution
