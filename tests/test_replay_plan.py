"""The replay plan on recorded H200 timelines: what ncu's deduplicated pass replays and which shape variants a
second pass must replay, recomputed here from the raw nsys export with SQL."""

from __future__ import annotations

import json
import re

import pytest
from fixtures_util import NSYS_RUNS, raw_innermost_sizes, raw_window_kernels, run_dir

from mcp_server.capture.replay_plan import plan_replays
from mcp_server.capture.variants import announce_plan

RUNS = (*NSYS_RUNS, "mlp_activations_inductor")


@pytest.mark.parametrize("run", RUNS)
def test_plan_is_the_raw_timelines_configurations_and_shape_variants(run, tmp_path_factory):
    db = run_dir(run, tmp_path_factory) / "nsys" / "report.sqlite"
    raw = raw_window_kernels(db)
    sizes = raw_innermost_sizes(db, raw)
    seen: dict[tuple, set] = {}
    variants = []
    for j, k in enumerate(raw):
        key = (k.mangled, k.grid, k.block, k.static_smem + k.dynamic_smem)
        if key in seen and sizes[j] not in seen[key]:
            variants.append(j)
        seen.setdefault(key, set()).add(sizes[j])
    plan = plan_replays(db)
    assert (plan.launches, plan.configurations, plan.variants) == (len(raw), len(seen), variants)
    if variants:
        names = sorted({raw[j].mangled for j in variants})
        assert plan.variant_names == names
        numbering = [j for j, k in enumerate(raw) if re.fullmatch(plan.kernel_regex, k.mangled)]
        assert numbering == [j for j, k in enumerate(raw) if k.mangled in names]
        assert numbering[plan.launch_skip] == variants[0]
        assert numbering[plan.launch_skip + plan.launch_count - 1] == variants[-1]


@pytest.mark.parametrize("run", RUNS)
def test_the_recorded_run_replayed_its_plans_variants(run, tmp_path_factory):
    """The run directory's own variant pass was given exactly this plan's filter (none when it has no variants)."""
    path = run_dir(run, tmp_path_factory)
    plan = plan_replays(path / "nsys" / "report.sqlite")
    # A variant pass started early under `ncu --mode launch` gets its filter from the ncu that attached to it.
    passes = {p["name"]: p.get("attach_command") or p["command"]
              for p in json.loads((path / "manifest.json").read_text())["passes"]}
    assert ("ncu_variants" in passes) == bool(plan.variants)
    if plan.variants:
        command = passes["ncu_variants"]
        flags = ("--kernel-name", "--launch-skip", "--launch-count")
        after = {flag: command[command.index(flag) + 1] for flag in flags}
        assert after == {"--kernel-name": f"regex:{plan.kernel_regex}", "--launch-skip": str(plan.launch_skip),
                         "--launch-count": str(plan.launch_count)}
        assert "--filter-mode" not in command


def test_the_plan_is_announced_with_estimates(tmp_path_factory):
    plan = plan_replays(run_dir("gpt2_eager", tmp_path_factory) / "nsys" / "report.sqlite")
    lines: list[str] = []
    announce_plan(plan, lines.append)
    assert lines[0] == (f"ncu: {plan.launches} window launches, {plan.configurations} distinct configurations "
                        f"replayed (estimate: {plan.configurations * 17 * 0.025:.0f} s of replay)")
    assert lines[1].startswith(f"ncu: {len(plan.variants)} launches share a configuration but not the input shapes")
    assert f"({plan.launch_count} launches; estimate: {plan.launch_count * 17 * 0.025:.0f} s" in lines[1]
