"""The optimized workload against what a user gets for free: eager, torch.compile and the best free recipe."""

from __future__ import annotations

from pydantic import BaseModel

from mcp_server.children.contract import AUTOCAST_HOW
from mcp_server.schema.analysis import SpeedOfLight
from mcp_server.schema.proof import BenchResult


class BaselineRow(BaseModel):
    """The optimized workload against one baseline a user could run instead."""

    label: str
    baseline_how: str
    baseline_median_ns: float
    optimized_median_ns: float
    point: float
    ci_low: float
    ci_high: float
    significant: bool
    file: str


class BaselinesView(BaseModel):
    """The optimized workload against eager, torch.compile and the best free recipe, and what that means."""

    rows: list[BaselineRow]
    verdict: str | None


def floor_evidence(floor: SpeedOfLight, tier: str) -> str:
    """What the speed-of-light floor says about a workload that is not faster than a free recipe."""
    ms = 1e6
    text = (f" Evidence from the speed-of-light floor ({floor.estimate_label}): the analysed window runs at "
            f"{floor.pct_of_speed_of_light:.0f} % of its speed of light in the precisions its kernels use (floor "
            f"{floor.floor_ns / ms:.3f} ms, window {floor.window_ns / ms:.3f} ms measured without the profiler)")
    if floor.reduced_precision_floor_ns < 0.8 * floor.floor_ns:
        reduced = floor.reduced_precision_floor_ns / ms
        text += f"; with its FP32 FLOPs on BF16 tensor cores the floor would be {reduced:.3f} ms"
        text += (": the exact tier may not lower precision, so what is left between the window and its floor is how "
                 "efficiently the kernels themselves run." if tier == "exact" else ".")
    else:
        text += ("; faster math would not lower it: its time is bytes, not FLOPs, and only fewer or narrower bytes "
                 "would.")
    return text


def baselines_view(
    benches: list[tuple[str, BenchResult, str]], floor: SpeedOfLight | None = None, tier: str = "exact"
) -> BaselinesView | None:
    """Rows per (label, bench, file) given; the verdict says plainly when the gain is torch.compile's for free, and,
    when the optimized workload is not faster than a free recipe, what the speed-of-light `floor` says."""
    if len(benches) < 2:
        return None
    rows = [BaselineRow(label=label, baseline_how=b.baseline.how_run, baseline_median_ns=b.baseline.summary.median_ns,
                        optimized_median_ns=b.optimized.summary.median_ns, point=b.speedup.point,
                        ci_low=b.speedup.ci_low, ci_high=b.speedup.ci_high, significant=b.speedup.significant,
                        file=file) for label, b, file in benches]
    free = next((r for r in rows if r.label != "eager"), None)
    verdict = None
    best = min((r for r in rows if r.label != "eager"), key=lambda r: r.ci_low, default=None)
    if best is not None and best.ci_low < 1.0 <= best.ci_high:
        verdict = (f"The loop's gain is what a user gets for free: against the baseline run as {best.baseline_how} "
                   f"the optimized workload is {best.point:.3f}× (95 % CI {best.ci_low:.3f}×–{best.ci_high:.3f}×, "
                   "not significant).")
    elif best is not None and best.ci_high < 1.0:
        verdict = (f"The optimized workload is slower than the baseline run as {best.baseline_how}: "
                   f"{best.point:.3f}× (95 % CI {best.ci_low:.3f}×–{best.ci_high:.3f}×).")
    elif free is not None:
        verdict = (f"The optimized workload is faster than every free baseline measured; the smallest margin is "
                   f"{best.point:.3f}× (95 % CI lower bound {best.ci_low:.3f}×) against {best.baseline_how}."
                   if best is not None else None)
    if verdict is not None and best is not None and best.ci_low < 1.0 and floor is not None:
        verdict += floor_evidence(floor, tier)
    if verdict is not None and any(AUTOCAST_HOW in r.baseline_how for r in rows):
        verdict += (" The free recipes under bf16 autocast were timed, not validated: their outputs were not checked "
                    "against the reduced tier's tolerance, which the optimized workload passed.")
    return BaselinesView(rows=rows, verdict=verdict)
