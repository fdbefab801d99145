"""`OptimizationPlan`: the optimizations.json the strategist writes and the backend engineer implements.

Each item is one proposed change, ranked, backed by evidence from the profile (trigger metrics with their
values), placed at an IR level (`functional`: an FX pass on Dynamo's torch-level graph; `aten`: a pass on the
aten graph after AOTAutograd; `inductor-config`: Inductor/torch.compile options), aimed at an operator and
module, pointing at a runnable pattern under `knowledge/`, and carrying an expected gain that is always
labelled an estimate. After implementation the item records whether it was applied (`status`) and the key the
backend writes into `APPLIED_PASSES`, so a report can say what was applied and what was not.

Run `python -m mcp_server.schema.optimizations optimizations.json` to validate a file (exit 1 with the errors).
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mcp_server.errors import ProfileFormatError
from mcp_server.schema.io import read_model
from mcp_server.schema.types import Tier

OPTIMIZATIONS_VERSION = "1.0"
OPTIMIZATIONS_JSON = "optimizations.json"
IR_LEVELS = ("functional", "aten", "inductor-config")
IrLevel = Literal["functional", "aten", "inductor-config", "module", "dynamo"]
Status = Literal["proposed", "implemented", "rejected", "deferred"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TriggerMetric(_Model):
    """One piece of evidence: a metric of the profile (or analysis) with the value that triggered the item."""

    metric: str = Field(
        description="A profile.json key: an `aggregated` field (e.g. 'tensor_core_active_pct'), a kernel metric "
        "key from plugins/ncu/metrics.yaml (e.g. 'stall_long_scoreboard'), or a window total (e.g. 'kernel_count')."
    )
    value: float
    unit: str | None = Field(default=None, description="e.g. '%', 'byte', 'ns', 'count'.")
    condition: str | None = Field(
        default=None, description="The rule it meets, e.g. '< 20' or '> 0.6 of window kernel time'."
    )
    source: str | None = Field(
        default=None, description="Where the value was read: an operator_id, 'kernel:<id>', or 'analysis.json'."
    )


class Target(_Model):
    """What the change acts on, in profile.json's own identities."""

    operator_name: str = Field(description="e.g. 'aten::conv2d' or an Inductor fused kernel group name.")
    module_path: str | None = Field(default=None, description="nn.Module path, e.g. 'features.0'; None for all.")
    operator_ids: list[str] = Field(default_factory=list, description="operator_id values in the baseline profile.")
    kernel_names: list[str] = Field(default_factory=list, description="The kernels the evidence comes from.")


class ExpectedGain(_Model):
    """What the change should save: an estimate, never a measurement (bench measures)."""

    label: Literal["estimate"] = Field(default="estimate", description="Always 'estimate'.")
    operator_time_saved_pct: float | None = Field(
        default=None, ge=0, le=100, description="Share of the targeted operators' GPU time the change removes."
    )
    end_to_end_speedup_low: float = Field(gt=0, description="Lower end of the estimated whole-window speedup (×).")
    end_to_end_speedup_high: float = Field(gt=0, description="Upper end of the estimated whole-window speedup (×).")
    basis: str = Field(description="How it was estimated, e.g. 'Amdahl: 58 % of kernel time × 2× faster conv'.")
    against: Literal["eager", "winner"] = Field(
        default="eager", description="The baseline the speedups are against: 'eager' (the workload as written) or "
        "'winner' (the tier's winner of the free frontier: a plan that starts from the floor states its floor item "
        "as 1.0× and each change beyond it as its gain over the floor). The report sets the applied items' product "
        "beside bench.json's speedup for 'eager' and bench_vs_free.json's for 'winner'.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> ExpectedGain:
        if self.end_to_end_speedup_low > self.end_to_end_speedup_high:
            raise ValueError("end_to_end_speedup_low must not exceed end_to_end_speedup_high")
        return self


class OptimizationItem(_Model):
    """One ranked, evidence-backed proposal."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Stable slug, e.g. 'conv-bn-fold'.")
    rank: int = Field(ge=1, description="1 = do first. Ranks are 1..N in list order.")
    title: str
    ir_level: IrLevel
    target: Target
    evidence: list[TriggerMetric] = Field(min_length=1)
    rationale: str = Field(description="Why the evidence points to this change (one or two sentences).")
    expected_gain: ExpectedGain
    pattern: str = Field(
        description="Pointer into knowledge/, e.g. 'knowledge/fx_patterns/conv_bn_fold.py' (path, optional '#name')."
    )
    pass_name: str = Field(
        description="The key the backend records in APPLIED_PASSES when this change is applied (validate reports it)."
    )
    precision_change: bool = Field(
        default=False, description="True when the change lowers precision (validate at that precision's tolerance)."
    )
    risks: list[str] = Field(default_factory=list)
    status: Status = "proposed"
    status_reason: str | None = Field(
        default=None, description="Why an item was rejected or deferred, or where it was implemented (file:line)."
    )

    @field_validator("pattern")
    @classmethod
    def _pattern_in_knowledge(cls, value: str) -> str:
        path = PurePosixPath(value.split("#", 1)[0])
        if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != "knowledge":
            raise ValueError("pattern must be a relative path under knowledge/ without '..', e.g. "
                             "knowledge/fx_patterns/conv_bn_fold.py")
        return value


FP8_PASSES = ("fp8_linear",)  # the patterns whose GEMMs run in FP8 (analysis.pattern_registry: fp8_linear's pass)


class OptimizationPlan(_Model):
    """optimizations.json: the ranked plan for one workload."""

    optimizations_version: str = OPTIMIZATIONS_VERSION
    workload: str = Field(description="The baseline workload file.")
    optimized_workload: str | None = Field(default=None, description="The <name>_optimized.py that implements it.")
    baseline_profile: str = Field(description="The profile.json the evidence comes from.")
    analysis: str | None = Field(default=None, description="The analysis.json consulted, if any.")
    device_name: str | None = None
    created_at: str
    tier: Tier = Field(
        default="exact", description="Precision tier the user chose: 'exact' keeps fp32 everywhere (no item may "
        "change precision); 'reduced' allows BF16/FP16/TF32 compute, validated at the reduced tolerance; 'fp8' also "
        "FP8 GEMMs, validated at its own.",
    )
    items: list[OptimizationItem] = Field(min_length=1)
    not_proposed: list[str] = Field(
        default_factory=list, description="Opportunities considered and left out, each with its reason."
    )

    @model_validator(mode="after")
    def _ranked(self) -> OptimizationPlan:
        ranks = [item.rank for item in self.items]
        if ranks != list(range(1, len(ranks) + 1)):
            raise ValueError(f"items must be listed in rank order 1..{len(ranks)}, found ranks {ranks}")
        ids = [item.id for item in self.items]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"item ids must be unique, repeated: {duplicates}")
        lowered = [item.id for item in self.items if item.precision_change and item.status != "rejected"]
        if self.tier == "exact" and lowered:
            raise ValueError(f"items {lowered} change precision, which the exact tier forbids: set tier to "
                             "'reduced' (the user's choice) or move them to not_proposed")
        fp8 = [item.id for item in self.items if item.pass_name in FP8_PASSES and item.status != "rejected"]
        if self.tier != "fp8" and fp8:
            raise ValueError(f"items {fp8} compute in FP8, which only the fp8 tier allows: set tier to 'fp8' (the "
                             "user's choice) or move them to not_proposed")
        return self


def load_optimizations(path: Path) -> OptimizationPlan:
    """Read and validate an optimizations.json; errors name the field and the remedy."""
    return read_model(Path(path), OptimizationPlan, "optimizations.json",
                      "write it with the strategist, fixing the fields named (schemas/optimizations.schema.json)")


def main(argv: list[str] | None = None) -> int:
    """Validate the files given; print one line each; exit 1 if any is invalid."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m mcp_server.schema.optimizations optimizations.json [...]", file=sys.stderr)
        return 2
    ok = True
    for name in paths:
        try:
            plan = load_optimizations(Path(name))
        except ProfileFormatError as exc:
            print(f"INVALID {exc.one_line()}")
            ok = False
            continue
        print(f"valid {name}: {len(plan.items)} item(s), ranks 1..{len(plan.items)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
