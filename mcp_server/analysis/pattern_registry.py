"""The optimization patterns, in one place: each one's name, the detectors' findings it answers, its runnable code
and its note under `knowledge/fx_patterns/`, its IR level and `APPLIED_PASSES` key, and the free recipe that already
gives it.

The analysis turns findings into opportunities through this table (an opportunity's `change_class` is a pattern's
name, its `knowledge` the pattern's code, or its note where it has none); the propose skill's pattern catalog lists
the same rows with their evidence (a test holds the two equal); `PatternName` is the checked type of a name.
A pattern with `recipes` is what a free recipe naming one of them does: on a workload already run by such a recipe,
it is not a change beyond the floor (the report's "what is left" leaves it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mcp_server.schema.optimizations import IrLevel
from mcp_server.schema.types import Tier, tiers_within

PatternName = Literal[
    "cuda_graphs", "whole_forward_graph", "inductor_config", "dtype_autocast", "channels_last", "sdpa_substitution",
    "conv_bn_fold", "qkv_fusion", "graph_breaks", "host_syncs", "bf16_weights", "fp16_weights", "tf32_scoped",
    "fp8_linear", "static_kv_cache", "triton_op", "graphed_training", "max_epilogue", "cudnn_benchmark",
    "host_compute",
]
FindingKind = Literal[
    "host_bound_window", "tiny_kernel_swarm", "fp32_matmul", "fp32_conv", "layout_conversion", "unfused_attention",
    "sdpa_math_path", "conv_bn_unfolded", "separate_qkv", "host_sync", "half_matmul", "growing_kv_cache",
    "split_fusion", "pooled_gemm_output", "heuristic_conv", "host_compute",
]
FOLDER = "knowledge/fx_patterns"


@dataclass(frozen=True)
class Pattern:
    """One optimization pattern (see the module's docstring)."""

    name: PatternName
    answers: tuple[FindingKind, ...]  # the findings (analysis/detect.py, classify.py) it is the change for
    ir_level: IrLevel
    pass_name: str  # the APPLIED_PASSES key an optimized workload records it under
    code: bool = True  # a runnable FOLDER/<name>.py beside its note FOLDER/<name>.md
    tier: Tier = "exact"  # the tightest precision tier that allows it: exact unless it changes precision
    recipes: tuple[str, ...] = ()  # the parts of a free recipe's name (any of them) that already apply it

    @property
    def precision_change(self) -> bool:
        """Whether it computes in a lower precision than fp32 (a tier looser than exact)."""
        return self.tier != "exact"

    @property
    def note(self) -> str:
        """Its one-page note."""
        return f"{FOLDER}/{self.name}.md"

    @property
    def knowledge(self) -> str:
        """What an opportunity points to: the runnable code, else the note."""
        return f"{FOLDER}/{self.name}.py" if self.code else self.note


PATTERNS: dict[PatternName, Pattern] = {p.name: p for p in (
    Pattern("cuda_graphs", ("host_bound_window", "tiny_kernel_swarm"), "inductor-config", "cuda_graphs",
            recipes=("reduce-overhead", "max-autotune")),
    Pattern("whole_forward_graph", ("host_bound_window", "tiny_kernel_swarm"), "module", "whole_forward_graph"),
    Pattern("graphed_training", ("host_bound_window", "tiny_kernel_swarm"), "module", "graphed_training"),
    Pattern("inductor_config", ("tiny_kernel_swarm", "host_bound_window"), "inductor-config", "inductor",
            recipes=("compile", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")),
    Pattern("dtype_autocast", ("fp32_matmul", "fp32_conv"), "functional", "bf16_compute", tier="reduced",
            recipes=("bf16-autocast", "fp16-autocast", "bf16-cast", "fp16-cast")),
    Pattern("channels_last", ("fp32_conv", "layout_conversion"), "functional", "channels_last",
            recipes=("channels-last",)),
    Pattern("sdpa_substitution", ("unfused_attention", "sdpa_math_path"), "functional", "sdpa_substitution"),
    Pattern("conv_bn_fold", ("conv_bn_unfolded",), "functional", "fold_conv_bn"),
    Pattern("qkv_fusion", ("separate_qkv",), "functional", "qkv_fusion"),
    Pattern("graph_breaks", (), "dynamo", "graph_breaks"),
    Pattern("host_syncs", ("host_sync",), "module", "host_syncs", code=False),
    Pattern("bf16_weights", ("fp32_matmul", "fp32_conv"), "module", "bf16_weights", tier="reduced",
            recipes=("bf16-cast",)),
    Pattern("fp16_weights", ("fp32_matmul", "fp32_conv"), "module", "fp16_weights", tier="reduced",
            recipes=("fp16-cast",)),
    Pattern("tf32_scoped", ("fp32_matmul", "fp32_conv"), "module", "tf32_scoped", tier="reduced",
            recipes=("tf32",)),
    Pattern("fp8_linear", ("half_matmul",), "module", "fp8_linear", tier="fp8"),
    Pattern("static_kv_cache", ("growing_kv_cache",), "module", "static_kv_cache"),
    Pattern("triton_op", ("split_fusion",), "functional", "triton_op"),
    Pattern("max_epilogue", ("pooled_gemm_output",), "module", "max_epilogue"),
    Pattern("cudnn_benchmark", ("heuristic_conv",), "module", "cudnn_benchmark", code=False,
            recipes=("cudnn-benchmark",)),
    Pattern("host_compute", ("host_compute",), "module", "host_compute", code=False),
)}


def knowledge_of(name: PatternName) -> str:
    """The knowledge/ pointer of pattern `name` (its code, else its note)."""
    return PATTERNS[name].knowledge


def needed_tier(name: str) -> str | None:
    """The tightest precision tier that allows pattern `name` (None for a name that is no pattern)."""
    return next((p.tier for p in PATTERNS.values() if p.name == name), None)


def allowed_in(name: str, tier: str) -> bool:
    """Whether pattern `name` keeps to precision tier `tier` (a reduced-precision change is not an exact-tier one);
    a name that is no pattern is not judged (True)."""
    needs = needed_tier(name)
    return needs is None or needs in tiers_within(tier)


def covered_by(name: PatternName, recipe: str) -> bool:
    """Whether free recipe `recipe` (a name `recipes` measured, e.g. `reduce-overhead+fp16-cast`) already applies
    pattern `name`."""
    return bool(set(PATTERNS[name].recipes) & set(recipe.split("+")))
