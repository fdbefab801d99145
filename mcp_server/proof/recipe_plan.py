"""Which free recipes to run, in which stage, and the lines of code each one is (pure functions, no processes).

The default frontier: fp32 eager first (the reference every error is measured against, and what says whether the
model has convolutions); then every compile mode a user gets without minutes of autotuning (eager, torch.compile's
default, reduce-overhead) crossed with every precision (fp32, TF32, bf16/fp16 autocast, the whole model cast to
bf16/fp16); then, for a model with convolutions, channels_last and cuDNN's autotuner on each tier's winner of that
stage. `--thorough` adds the max-autotune modes and tries channels_last and the autotuner on every recipe. On the
CPU: eager and the default compile, fp32, bf16 autocast and the bf16 cast, and channels_last.
"""

from __future__ import annotations

from itertools import product

from mcp_server.children.contract import (
    RECIPE_COMPILE_MODES,
    RECIPE_PRECISIONS,
    REFERENCE_RECIPE,
    half_dtype_name,
    recipe_name,
    recipe_parts,
)
from mcp_server.schema.proof import Metric
from mcp_server.schema.recipes import InputsForm, ModelFacts, RecipeResult, SkippedRecipes
from mcp_server.schema.types import TIERS, tiers_within

DEFAULT_MODES = ("eager", "compile", "reduce-overhead")
CPU_MODES = ("eager", "compile")
CPU_PRECISIONS = ("fp32", "bf16-autocast", "bf16-cast")
GPU_ONLY = "needs a CUDA GPU: TF32, fp16, cuDNN's autotuner and CUDA graphs are GPU features"
THOROUGH_ONLY = "max-autotune compiles for minutes: run with --thorough"
NO_CONV = "the model has no convolution: channels_last and cuDNN's autotuner change nothing"
NO_CONV2D = "the model has no 2-D convolution: channels_last, which lays out 4-d tensors, changes nothing"
NOT_MODULE = "the model is not an nn.Module: it cannot be cast or converted to channels_last"
WINNERS_ONLY = "tried on each tier's winner of the precision stage only (--thorough tries every recipe)"
Planned = list[tuple[str, str]]  # (recipe, stage)


def _layouts(gpu: bool, conv2d: bool, conv: bool) -> list[tuple[bool, bool]]:
    """(channels_last, cudnn_benchmark) pairs that can change something: channels_last with 2-D convolutions (it lays
    out 4-d tensors), cuDNN's autotuner with any convolution on a GPU."""
    pairs = ((False, False), (True, False), (False, True), (True, True))
    return [(cl, cb) for cl, cb in pairs if (conv2d or not cl) and ((conv and gpu) or not cb)]


def _every(modes: tuple[str, ...], precisions: tuple[str, ...], layouts: list[tuple[bool, bool]]) -> list[str]:
    return [recipe_name(m, p, cl, cb) for m, p, (cl, cb) in product(modes, precisions, layouts)]


def every_recipe(gpu: bool, conv2d: bool, conv: bool) -> list[str]:
    """Every recipe the device allows (the thorough frontier), the reference first, with the layouts that apply to a
    model with 2-D convolutions (`conv2d`) and with any (`conv`)."""
    modes = RECIPE_COMPILE_MODES if gpu else CPU_MODES
    return _every(modes, RECIPE_PRECISIONS if gpu else CPU_PRECISIONS, _layouts(gpu, conv2d, conv))


def _conv2d(facts: ModelFacts) -> bool:
    """Whether the model has 2-D convolutions (a recipes.json without the fact: any convolution)."""
    return facts.has_convolution if facts.has_conv2d is None else facts.has_conv2d


def plan_first(gpu: bool, facts: ModelFacts, thorough: bool, only: tuple[str, ...] = ()) -> Planned:
    """The recipes to run after the reference, longest compiles first."""
    if only:
        return [(r, "precision") for r in only if r != REFERENCE_RECIPE]
    if thorough:
        chosen, stage = every_recipe(gpu, _conv2d(facts), facts.has_convolution), "thorough"
    else:
        modes = DEFAULT_MODES if gpu else CPU_MODES
        chosen, stage = _every(modes, RECIPE_PRECISIONS if gpu else CPU_PRECISIONS, [(False, False)]), "precision"
    chosen = [r for r in chosen if r != REFERENCE_RECIPE and (facts.is_module or not _needs_module(r))]
    return [(r, stage) for r in sorted(chosen, key=_compile_cost, reverse=True)]


def plan_layout(gpu: bool, facts: ModelFacts, winners: list[str], thorough: bool, already: set[str]) -> Planned:
    """Channels_last (2-D convolutions) and cuDNN's autotuner (any convolution, on a GPU) on each tier's winner of the
    precision stage (conv models only)."""
    if thorough or not (facts.has_convolution and facts.is_module):
        return []
    planned: list[str] = []
    for winner in dict.fromkeys(winners):
        mode, precision, _, _ = recipe_parts(winner)
        for cl, cb in _layouts(gpu, _conv2d(facts), facts.has_convolution)[1:]:
            name = recipe_name(mode, precision, cl, cb)
            if name not in already and name not in planned:
                planned.append(name)
    return [(r, "layout") for r in planned]


def skipped(gpu: bool, facts: ModelFacts | None, thorough: bool, only: tuple[str, ...],
            ran: set[str], stopped: str | None = None) -> list[SkippedRecipes]:
    """Every recipe of the thorough GPU frontier that did not run, grouped by why (`stopped`: why the run ended
    before every planned recipe ran)."""
    groups: dict[str, list[str]] = {}
    for name in every_recipe(True, True, True):
        if name in ran or name == REFERENCE_RECIPE:
            continue
        mode, _, channels_last, cudnn_benchmark = recipe_parts(name)
        layout = channels_last or cudnn_benchmark
        if only and name not in only:
            reason = "not asked for (only: " + ", ".join(only) + ")"
        elif only:  # asked for, planned, and not run
            reason = f"not run: the run was stopped ({stopped})" if stopped else "not run"
        elif not gpu and not _cpu_recipe(name):
            reason = GPU_ONLY
        elif facts is not None and not facts.is_module and (_needs_module(name)):
            reason = NOT_MODULE
        elif mode.startswith("max-autotune") and not thorough:
            reason = THOROUGH_ONLY
        elif layout and facts is not None and not facts.has_convolution:
            reason = NO_CONV
        elif channels_last and facts is not None and not _conv2d(facts):
            reason = NO_CONV2D
        elif layout:
            reason = WINNERS_ONLY
        else:
            reason = f"not run: the run was stopped ({stopped})" if stopped else "not run"
        groups.setdefault(reason, []).append(name)
    return [SkippedRecipes(recipes=names, reason=reason) for reason, names in groups.items()]


def _needs_module(name: str) -> bool:
    _, precision, channels_last, _ = recipe_parts(name)
    return precision.endswith("-cast") or channels_last


def _cpu_recipe(name: str) -> bool:
    mode, precision, _, cudnn = recipe_parts(name)
    return mode in CPU_MODES and precision in CPU_PRECISIONS and not cudnn


def _compile_cost(name: str) -> int:
    """A rough rank of compile time: autotuning first, CUDA graphs next, eager last."""
    mode = recipe_parts(name)[0]
    return {"max-autotune": 4, "max-autotune-no-cudagraphs": 3, "reduce-overhead": 2, "compile": 1}.get(mode, 0)


def stage_winners(results: list[RecipeResult], metric: Metric = "latency") -> list[str]:
    """The fastest recipe of each tier among `results` (a recipe of a tighter tier counts for the looser ones)."""
    found = []
    for tiers in (tiers_within(t) for t in TIERS):
        ranked = [r for r in results if r.status == "ok" and r.tier in tiers and r.time_ns(metric) is not None]
        if ranked:
            found.append(min(ranked, key=lambda r: r.time_ns(metric) or 0.0).recipe)
    return found


def input_casts(recipe: str) -> list[str]:
    """The expressions, in `x`, that convert one input tensor for `recipe` (its cast, then its layout), as
    `children/recipe.apply` converts them: the pasted lines and the optimized workload's prepare_inputs both."""
    _, precision, channels_last, _ = recipe_parts(recipe)
    casts = []
    if precision.endswith("-cast"):
        casts.append(f"x.to({half_dtype_name(precision)}) if x.is_floating_point() else x")
    if channels_last:
        casts.append("x.contiguous(memory_format=torch.channels_last) if x.is_floating_point() and x.dim() == 4 "
                     "else x")
    return casts


def recipe_code(name: str, device: str, inputs_form: InputsForm = "tuple") -> list[str]:
    """The lines a user pastes to apply recipe `name` to `model` and its `inputs` (a tuple of positional arguments, a
    dict of keyword arguments or one tensor, as `inputs_form` says; its tensors nested in tuples, lists or dicts as
    the model takes them), on `device`."""
    mode, precision, channels_last, cudnn_benchmark = recipe_parts(name)
    lines = []
    if device == "cuda":
        tf32 = "True" if precision == "tf32" else "False"
        lines += [f"torch.backends.cuda.matmul.allow_tf32 = {tf32}", f"torch.backends.cudnn.allow_tf32 = {tf32}"]
    if cudnn_benchmark:
        lines.append("torch.backends.cudnn.benchmark = True")
    if precision.endswith("-cast"):
        lines.append(f"model = model.to({half_dtype_name(precision)})")
    if channels_last:
        lines.append("model = model.to(memory_format=torch.channels_last)")
    casts = input_casts(name)
    if casts:  # the inputs' tensors, however nested, as the recipe ran
        lines.append("from torch.utils._pytree import tree_map")
        lines += [f"inputs = tree_map(lambda x: ({cast}) if torch.is_tensor(x) else x, inputs)" for cast in casts]
    if mode == "compile":
        lines.append("model = torch.compile(model)")
    elif mode != "eager":
        lines.append(f'model = torch.compile(model, mode="{mode}")')
    call = {"tuple": "out = model(*inputs)", "dict": "out = model(**inputs)",
            "tensor": "out = model(inputs)"}[inputs_form]
    if precision.endswith("-autocast"):
        lines += [f'with torch.autocast("{device}", dtype={half_dtype_name(precision)}):', f"    {call}"]
    else:
        lines.append(call)
    return lines
