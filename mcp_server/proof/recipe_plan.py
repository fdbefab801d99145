"""Which free recipes to run, in which stage, and the lines of code each one is (pure functions, no processes).

The default frontier: fp32 eager first (the reference every error is measured against, and what says whether the
model has convolutions); then every compile mode a user gets without minutes of autotuning (eager, torch.compile's
default, reduce-overhead) crossed with every precision (fp32, TF32, bf16/fp16 autocast, the whole model cast to
bf16/fp16); then, for a model with convolutions, the channels-last layout (channels_last for 2-D convolutions,
channels_last_3d for 3-D ones) and cuDNN's autotuner on each tier's winner of that stage. `--thorough` adds the
max-autotune modes and tries the layout and the autotuner on every recipe. On the CPU: eager and the default
compile, fp32, bf16 autocast and the bf16 cast, and the layout.
"""

from __future__ import annotations

from itertools import product

from mcp_server.children.contract import (
    CHANNELS_LAST,
    CHANNELS_LAST_3D,
    MEMORY_FORMATS,
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
NO_CONV3D = "the model has no 3-D convolution: channels_last_3d, which lays out 5-d tensors, changes nothing"
MIXED_CONV = ("the model has 2-D and 3-D convolutions: no one memory format lays out both (model.to() converts "
              "every 4-d and 5-d weight to the one it is given)")
NOT_MODULE = "the model is not an nn.Module: it cannot be cast or converted to channels_last"
WINNERS_ONLY = "tried on each tier's winner of the precision stage only (--thorough tries every recipe)"
Planned = list[tuple[str, str]]  # (recipe, stage)


def _layouts(gpu: bool, layout: str, conv: bool) -> list[tuple[str, bool]]:
    """(layout, cudnn_benchmark) pairs that can change something: the model's layout (`layout`, "" when none
    applies), cuDNN's autotuner with any convolution on a GPU."""
    pairs = (("", False), (layout, False), ("", True), (layout, True))
    return [(lay, cb) for lay, cb in dict.fromkeys(pairs) if (layout or not lay) and ((conv and gpu) or not cb)]


def _every(modes: tuple[str, ...], precisions: tuple[str, ...], layouts: list[tuple[str, bool]]) -> list[str]:
    return [recipe_name(m, p, lay, cb) for m, p, (lay, cb) in product(modes, precisions, layouts)]


def every_recipe(gpu: bool, layout: str, conv: bool) -> list[str]:
    """Every recipe the device allows (the thorough frontier), the reference first, with the model's channels-last
    layout (`layout`, "" when none applies) and cuDNN's autotuner when it has convolutions (`conv`)."""
    modes = RECIPE_COMPILE_MODES if gpu else CPU_MODES
    return _every(modes, RECIPE_PRECISIONS if gpu else CPU_PRECISIONS, _layouts(gpu, layout, conv))


def model_layout(facts: ModelFacts) -> str:
    """The channels-last layout of the model's convolutions: channels-last for 2-D ones (a recipes.json without
    the fact: any convolution), channels-last-3d for 3-D ones, "" for none, or for both at once."""
    conv2d = facts.has_convolution if facts.has_conv2d is None else facts.has_conv2d
    conv3d = bool(facts.has_conv3d)
    return "" if conv2d == conv3d else CHANNELS_LAST if conv2d else CHANNELS_LAST_3D


def plan_first(gpu: bool, facts: ModelFacts, thorough: bool, only: tuple[str, ...] = ()) -> Planned:
    """The recipes to run after the reference, longest compiles first."""
    if only:
        return [(r, "precision") for r in only if r != REFERENCE_RECIPE]
    if thorough:
        chosen, stage = every_recipe(gpu, model_layout(facts), facts.has_convolution), "thorough"
    else:
        modes = DEFAULT_MODES if gpu else CPU_MODES
        chosen, stage = _every(modes, RECIPE_PRECISIONS if gpu else CPU_PRECISIONS, [("", False)]), "precision"
    chosen = [r for r in chosen if r != REFERENCE_RECIPE and (facts.is_module or not _needs_module(r))]
    return [(r, stage) for r in sorted(chosen, key=_compile_cost, reverse=True)]


def plan_layout(gpu: bool, facts: ModelFacts, winners: list[str], thorough: bool, already: set[str]) -> Planned:
    """The channels-last layout (2-D or 3-D convolutions) and cuDNN's autotuner (any convolution, on a GPU) on each
    tier's winner of the precision stage (conv models only)."""
    if thorough or not (facts.has_convolution and facts.is_module):
        return []
    planned: list[str] = []
    for winner in dict.fromkeys(winners):
        mode, precision, _, _ = recipe_parts(winner)
        for lay, cb in _layouts(gpu, model_layout(facts), facts.has_convolution)[1:]:
            name = recipe_name(mode, precision, lay, cb)
            if name not in already and name not in planned:
                planned.append(name)
    return [(r, "layout") for r in planned]


def skipped(gpu: bool, facts: ModelFacts | None, thorough: bool, only: tuple[str, ...],
            ran: set[str], stopped: str | None = None) -> list[SkippedRecipes]:
    """Every recipe of the thorough GPU frontier that did not run, grouped by why (`stopped`: why the run ended
    before every planned recipe ran)."""
    groups: dict[str, list[str]] = {}
    listed = (model_layout(facts) if facts is not None else "") or CHANNELS_LAST  # the layout the reasons name
    for name in every_recipe(True, listed, True):
        if name in ran or name == REFERENCE_RECIPE:
            continue
        mode, _, channels_last, cudnn_benchmark = recipe_parts(name)
        layout = bool(channels_last) or cudnn_benchmark
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
        elif channels_last and facts is not None and not model_layout(facts):
            reason = MIXED_CONV if facts.has_conv3d else NO_CONV2D
        elif layout:
            reason = WINNERS_ONLY
        else:
            reason = f"not run: the run was stopped ({stopped})" if stopped else "not run"
        groups.setdefault(reason, []).append(name)
    return [SkippedRecipes(recipes=names, reason=reason) for reason, names in groups.items()]


def _needs_module(name: str) -> bool:
    _, precision, channels_last, _ = recipe_parts(name)
    return precision.endswith("-cast") or bool(channels_last)


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
    _, precision, layout, _ = recipe_parts(recipe)
    casts = []
    if precision.endswith("-cast"):
        casts.append(f"x.to({half_dtype_name(precision)}) if x.is_floating_point() else x")
    if layout:
        format_name, rank = MEMORY_FORMATS[layout]
        casts.append(f"x.contiguous(memory_format=torch.{format_name}) if x.is_floating_point() and x.dim() == "
                     f"{rank} else x")
    return casts


def recipe_code(name: str, device: str, inputs_form: InputsForm = "tuple") -> list[str]:
    """The lines a user pastes to apply recipe `name` to `model` and its `inputs` (a tuple of positional arguments, a
    dict of keyword arguments or one tensor, as `inputs_form` says; its tensors nested in tuples, lists or dicts as
    the model takes them), on `device`."""
    mode, precision, layout, cudnn_benchmark = recipe_parts(name)
    lines = []
    if device == "cuda":
        tf32 = "True" if precision == "tf32" else "False"
        lines += [f"torch.backends.cuda.matmul.allow_tf32 = {tf32}", f"torch.backends.cudnn.allow_tf32 = {tf32}"]
    if cudnn_benchmark:
        lines.append("torch.backends.cudnn.benchmark = True")
    if precision.endswith("-cast"):
        lines.append(f"model = model.to({half_dtype_name(precision)})")
    if layout:
        lines.append(f"model = model.to(memory_format=torch.{MEMORY_FORMATS[layout][0]})")
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
