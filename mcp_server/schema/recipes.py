"""recipes.json: the free frontier of a workload, each recipe timed in its own process and validated.

A recipe is what a user pastes in a few lines without understanding the model (a torch.compile mode, a precision,
channels_last, cuDNN's autotuner), named as `children.contract.recipe_parts` reads it. Each result says how fast
the recipe ran (latency and back-to-back, ns per call), how far its outputs are from fp32 eager with TF32 off over
several seeds, and which precision tier that error puts it in; the winners are the fastest validated recipe of each
tier, by each metric.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mcp_server.children.contract import REFERENCE_RECIPE, recipe_name, recipe_parts
from mcp_server.schema.proof import Metric, TimingSummary
from mcp_server.schema.types import TIERS, Tier, tiers_within

# 1.1: `stopped`; 1.2: `written_error`; 1.3: the runoff (`RecipeResult.runoff`, `runoff`);
# 1.4: `model.inputs_form`, `model.dropout_in_training`
RECIPES_VERSION = "1.4"
# The error that puts a recipe in a tier, over fp32 eager with TF32 off (validate's rule: |opt - ref| <= rtol *
# (|ref| + RMS(ref)) per element): float32's class for the exact tier, bfloat16/float16's for the reduced one, and for
# the fp8 tier that of 3 mantissa bits on both operands of a GEMM with per-tensor scales (a two-layer MLP lost up to
# 24 % of its output's RMS: knowledge/fx_patterns/fp8_linear.py).
TIER_RTOL: dict[str, float] = {"exact": 1e-4, "reduced": 1e-2, "fp8": 0.25}
# More processes for each recipe of a runoff: three in all, whose median is the usual speed's on a host whose speed
# differs between processes, unless two of the three met the unusual one.
RUNOFF_ROUNDS = 2


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def canonical(name: str) -> str:
    """A recipe name in its canonical spelling; ValueError (with what is wrong) when it is not one."""
    return recipe_name(*recipe_parts(name))


class RecipeError(_Model):
    """How far a recipe's outputs are from the reference's, over every seed and output."""

    seeds: list[int]
    outputs_compared: int = Field(description="Output tensors compared (every seed's).")
    max_abs_error: float | None = None
    max_rel_error: float | None = Field(
        default=None, description="max |out - ref| / (|ref| + RMS(ref)) over every element, output and seed.")
    rel_error_percentiles: dict[str, float] | None = Field(
        default=None, description="p50, p90, p99, p99.9 of that relative error: the largest over the outputs.")
    problems: list[str] = Field(default_factory=list,
                                description="What no tolerance excuses: NaN/Inf, other shapes, integers that differ.")


class ProcessTimes(_Model):
    """One more process of a recipe, run by the runoff: its medians per call."""

    latency_ns: float
    back_to_back_ns: float
    wall_time_s: float


class RecipeResult(_Model):
    """One recipe, run in its own process."""

    recipe: str
    stage: Literal["reference", "precision", "layout", "thorough"] = Field(
        description="reference: fp32 eager, run first; precision: compile modes x precisions; layout: channels_last "
        "and cuDNN's autotuner on each tier's winner; thorough: every combination (--thorough).")
    status: Literal["ok", "failed", "timed_out", "not_applicable"]
    reason: str | None = Field(default=None, description="Why it failed, timed out or does not apply.")
    tier: Tier | None = Field(default=None, description="The tightest tier its error meets; None: it failed "
                              "validation for both, or did not run.")
    latency: TimingSummary | None = None
    back_to_back: TimingSummary | None = None
    first_call_ns: int | None = Field(default=None, description="The first call, compilation included.")
    wall_time_s: float = Field(description="The recipe's process, start-up and compilation included.")
    error: RecipeError | None = None
    code: list[str] = Field(default_factory=list, description="The lines a user pastes to apply it.")
    warnings: list[str] = Field(default_factory=list)
    runoff: list[ProcessTimes] = Field(
        default_factory=list, description="More processes of this recipe, run when one process could not tell it "
        "from its tier's winner; its time is then the median of every process's median (1.3).")

    def process_medians(self, metric: Metric) -> list[float]:
        """The median per call by `metric` of each of its processes: the first (validated), then the runoff's."""
        summary = self.latency if metric == "latency" else self.back_to_back
        if summary is None:
            return []
        more = [p.latency_ns if metric == "latency" else p.back_to_back_ns for p in self.runoff]
        return [summary.median_ns, *more]

    def time_ns(self, metric: Metric) -> float | None:
        """The time per call by `metric`, when it ran: its process's median, or the median of its processes'
        medians when the runoff ran it again."""
        medians = self.process_medians(metric)
        return statistics.median(medians) if medians else None


class Winner(_Model):
    """The fastest validated recipe of a tier by one metric."""

    tier: Tier
    metric: Metric
    recipe: str
    time_ns: float = Field(description="Its median time per call by `metric`.")
    speedup_vs_reference: float | None = Field(
        default=None, description="fp32 eager's median time / this recipe's, by the same metric.")
    max_rel_error: float | None = None
    code: list[str]


class SkippedRecipes(_Model):
    """Recipes not run, and why."""

    recipes: list[str]
    reason: str


InputsForm = Literal["tuple", "dict", "tensor"]


class ModelFacts(_Model):
    """What decides which recipes apply."""

    is_module: bool
    has_convolution: bool
    has_conv2d: bool | None = Field(default=None, description="2-D convolutions, the ones channels_last lays out "
                                    "(a recipes.json from before this field: taken as has_convolution).")
    has_conv3d: bool | None = Field(default=None, description="3-D convolutions, the ones channels_last_3d lays out "
                                    "(a recipes.json from before this field: none).")
    parameters: int
    parameter_dtypes: list[str]
    floating_inputs: int
    input_shapes: list[list[int]]
    inputs_form: InputsForm = Field(default="tuple", description="How get_model_and_input() returns the inputs: a "
                                    "tuple of positional arguments (the recipe's lines call model(*inputs)), a dict of "
                                    "keyword arguments (model(**inputs)) or one tensor (model(inputs)).")
    dropout_in_training: list[str] = Field(default_factory=list, description="Dropout modules left in training mode "
                                           "(the first five): each call's output differs, so no recipe validates.")


    @property
    def written_precision(self) -> str:
        """The floating-point precision the model's parameters are written in: `fp32`, or their dtypes (`bfloat16`)
        when the user wrote it in another (the reference, eager as written, then computes in those)."""
        floating = [d for d in self.parameter_dtypes if d.startswith(("float", "bfloat", "half"))]
        return "fp32" if set(floating) <= {"float32"} else " and ".join(floating)


class RecipesReport(_Model):
    """recipes.json: the free frontier of one workload on one device."""

    recipes_version: str = RECIPES_VERSION
    workload: str
    reference: str = Field(default=REFERENCE_RECIPE, description="What the errors are measured against.")
    device_type: str
    device_name: str | None = None
    torch_version: str
    cuda_version: str | None = None
    python_executable: str
    model: ModelFacts | None = None
    written_error: RecipeError | None = Field(
        default=None, description="(a model written in bfloat16/float16) the workload as written against itself in "
        "float32, parameters and floating inputs upcast: twice its largest relative error is every tier's tolerance "
        "at least, since two implementations of the model may each be that far from fp32 (1.2).")
    seeds: list[int] = Field(description="Seeds whose models and inputs every recipe was validated on.")
    tier_rtol: dict[str, float] = Field(default_factory=lambda: dict(TIER_RTOL))
    thorough: bool
    jobs: int = Field(description="Recipe processes at a time (their timed windows take turns on the GPU).")
    results: list[RecipeResult] = Field(description="Every recipe run, fastest latency first; failures last.")
    winners: list[Winner] = Field(default_factory=list)
    pareto: list[str] = Field(default_factory=list,
                              description="Recipes no other is both faster (latency) than and more exact than.")
    skipped: list[SkippedRecipes] = Field(default_factory=list)
    started_at: str
    finished_at: str
    wall_time_s: float
    warnings: list[str] = Field(default_factory=list)
    stopped: str | None = Field(default=None, description="Why the run ended early (a signal, a cancel): the frontier "
                                "holds only the recipes measured until then (1.1).")
    runoff_rounds: int = Field(default=0, description="More processes the runoff ran for each recipe one process "
                               "could not tell from its tier's winner (1.3).")
    runoff_tiers: list[str] = Field(default_factory=list, description="The tiers whose races the runoff ran (1.3).")
    runoff_changed: list[str] = Field(default_factory=list, description="Winners the runoff changed, as `tier "
                                      "(metric): first-process winner -> winner` (1.3).")

    @property
    def reference_label(self) -> str:
        """How the reference reads in a sentence: `fp32 eager`, or `eager as written in bfloat16` for a model whose
        parameters are not float32 (what every error and speedup is then against)."""
        written = self.model.written_precision if self.model is not None else "fp32"
        return "fp32 eager" if written == "fp32" else f"eager as written in {written}"

    @field_validator("results")
    @classmethod
    def _known(cls, results: list[RecipeResult]) -> list[RecipeResult]:
        for result in results:
            canonical(result.recipe)
        return results

    def winner(self, tier: str, metric: Metric = "latency") -> Winner | None:
        """The winner of `tier` by `metric`, if any recipe of that tier, or of a tighter one, validated (a report
        written before the fp8 tier has no winner of its own for it: the reduced tier's is)."""
        own = next((w for w in self.winners if w.tier == tier and w.metric == metric), None)
        if own is not None or tier not in TIERS:
            return own
        tighter = [w for w in self.winners if w.tier in tiers_within(tier) and w.metric == metric]
        return min(tighter, key=lambda w: w.time_ns) if tighter else None

    def result(self, recipe: str) -> RecipeResult | None:
        """The result of `recipe` (any spelling of its name)."""
        name = canonical(recipe)
        return next((r for r in self.results if r.recipe == name), None)
