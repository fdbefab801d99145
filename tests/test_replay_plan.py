"""The replay plan on recorded H200 and H100 timelines: what ncu's deduplicated pass replays and which shape
variants a second pass must replay, recomputed here from the raw nsys export with SQL."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from pathlib import Path

import pytest
from fixtures_util import (
    NSYS_RUNS,
    raw_enclosing_ranges,
    raw_innermost_sizes,
    raw_window_kernels,
    resnet50_nsys,
    run_dir,
)

from mcp_server.assemble.join import join_counters
from mcp_server.capture.replay_plan import plan_replays
from mcp_server.capture.variants import announce_plan
from mcp_server.schema.profile import Metric
from mcp_server.schema.records import CounterRecord
from plugins.nsys.reader import read_window

RUNS = (*NSYS_RUNS, "mlp_activations_inductor")


@pytest.mark.parametrize("run", RUNS)
def test_plan_is_the_raw_timelines_configurations_and_shape_variants(run, tmp_path_factory):
    db = run_dir(run, tmp_path_factory) / "nsys" / "report.sqlite"
    raw = raw_window_kernels(db)
    sizes = raw_innermost_sizes(db, raw)
    seen, variants, same_work = _raw_variants(raw, sizes)
    plan = plan_replays(db)
    assert (plan.launches, plan.configurations, plan.variants) == (len(raw), len(seen), variants)
    assert plan.same_work == len(same_work)
    if variants:
        names = sorted({raw[j].mangled for j in variants})
        assert plan.variant_names == names
        numbering = [j for j, k in enumerate(raw) if re.fullmatch(plan.kernel_regex, k.mangled)]
        assert numbering == [j for j, k in enumerate(raw) if k.mangled in names]
        assert numbering[plan.launch_skip] == variants[0]
        assert numbering[plan.launch_skip + plan.launch_count - 1] == variants[-1]


def _numels(sizes: str | None) -> list[int | None] | None:
    if sizes is None:
        return None
    return [math.prod(d) if isinstance(d, list) and all(isinstance(x, int) for x in d) else None
            for d in json.loads(sizes)]


def _raw_variants(raw, sizes):
    """(configurations, variant launch positions, same-work launches): a launch of a known configuration with
    new input sizes is a variant, unless it is a cuDNN layout conversion (its configuration tiles the one tensor it
    converts) or PyTorch's contiguous element-wise kernel over inputs of the same element counts as the
    configuration's first launch."""
    seen: dict[tuple, set] = {}
    first: dict[tuple, str | None] = {}
    variants, same_work = [], []
    for j, k in enumerate(raw):
        key = (k.mangled, k.grid, k.block, k.static_smem + k.dynamic_smem)
        if key in seen and sizes[j] not in seen[key]:
            elementwise = re.search(r"\b(vectorized|unrolled)_elementwise_kernel<", k.demangled)
            layout = re.search(r"cudnn::engines_precompiled::(nchwToNhwc|nhwcToNchw)Kernel<", k.demangled)
            a, b = _numels(first[key]), _numels(sizes[j])
            if layout or (elementwise and a is not None and a == b):
                same_work.append(j)
            else:
                variants.append(j)
        seen.setdefault(key, set()).add(sizes[j])
        first.setdefault(key, sizes[j])
    return seen, variants, same_work


@pytest.mark.parametrize("run", RUNS)
def test_the_recorded_run_replayed_its_plans_variants(run, tmp_path_factory):
    """The run directory's own variant pass (recorded before variants were scoped to module calls) replayed a run
    of launches holding every variant of this plan (none when it has no variants)."""
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
        raw = raw_window_kernels(path / "nsys" / "report.sqlite")
        numbering = [j for j, k in enumerate(raw) if re.fullmatch(after["--kernel-name"].removeprefix("regex:"),
                                                                  k.mangled)]
        skip, count = int(after["--launch-skip"]), int(after["--launch-count"])
        assert set(plan.variants) <= set(numbering[skip:skip + count])
        assert "--filter-mode" not in command


def test_the_plan_is_announced_with_estimates(tmp_path_factory):
    plan = plan_replays(run_dir("gpt2_eager", tmp_path_factory) / "nsys" / "report.sqlite")
    lines: list[str] = []
    announce_plan(plan, lines.append)
    assert lines[0] == (f"ncu: {plan.launches} window launches, {plan.configurations} distinct configurations "
                        f"replayed by the ncu pass (estimate: {plan.configurations * 12 * 0.025:.0f} s of replay)")
    assert lines[1].startswith(f"ncu: {len(plan.variants)} launches share a configuration but not the input shapes")
    count = len(plan.replayed) if plan.calls is not None else plan.launch_count
    assert f"({count} launches " in lines[1] and f"estimate: {count * 12 * 0.025:.0f} s" in lines[1]


@pytest.fixture(scope="module")
def resnet50(tmp_path_factory) -> Path:
    """The nsys export of torchvision's ResNet-50 (eager, batch 32), recorded on an H100 by
    `operator-profiler run scripts/gpu_workloads/resnet50.py` (the run's nsys/report.sqlite, xz-compressed)."""
    return resnet50_nsys(tmp_path_factory.mktemp("resnet50"))


def test_resnet50s_variants_replay_inside_the_module_calls_that_launch_them(resnet50):
    raw = raw_window_kernels(resnet50)
    sizes = raw_innermost_sizes(resnet50, raw)
    _, variants, same_work = _raw_variants(raw, sizes)
    plan = plan_replays(resnet50)
    assert plan.variants == variants and len(variants) == 6  # 2 batch norms and 4 convolutions
    # 6 ReLUs over as many elements as the first of their configuration, 9 cuDNN layout conversions
    assert plan.same_work == len(same_work) == 15
    # each variant's innermost module range, from the raw ranges; its call number among that module's calls
    modules: dict[int, tuple[str, int]] = {}
    calls: dict[str, set[int]] = {}
    with sqlite3.connect(f"file:{resnet50}?mode=ro", uri=True) as conn:
        for j, k in enumerate(raw):
            found = [(start, text[len("module:"):]) for start, _, text in
                     raw_enclosing_ranges(conn, k.global_tid, k.api_start) if text.startswith("module:")]
            for start, path in found:
                calls.setdefault(path, set()).add(start)
            if j in variants:
                modules[j] = (found[-1][1], found[-1][0])
    expected = sorted({(path, sorted(calls[path]).index(start)) for path, start in modules.values()})
    assert plan.calls == expected and ("layer1.0.bn1", 0) in expected
    # replayed: the variant kernels' launches inside those calls, the variants first among them
    chosen = set(modules.values())
    names = {raw[j].mangled for j in variants}
    with sqlite3.connect(f"file:{resnet50}?mode=ro", uri=True) as conn:
        inside = [j for j, k in enumerate(raw) if k.mangled in names and any(
            (text[len("module:"):], start) in chosen
            for start, _, text in raw_enclosing_ranges(conn, k.global_tid, k.api_start) if text.startswith("module:"))]
    assert plan.replayed == inside and set(variants) <= set(inside)
    assert len(plan.replayed) < plan.launch_count  # 20 launches, not the run of 106 from the first to the last


def test_scoped_variant_records_join_the_launches_the_plan_replayed(resnet50):
    """The variant pass's records, in replay order, land on the launches the plan named: not on the first
    launches of their kernels in the window, where a join by kernel alone would put them."""
    launches = read_window(resnet50, lambda window: list(window.kernels()))
    plan = plan_replays(resnet50)
    by_ordinal = {k.ordinal: k for k in launches}
    records = [CounterRecord(ordinal=i, name=by_ordinal[o].name, mangled_name=by_ordinal[o].mangled_name,
                             grid=by_ordinal[o].grid, block=by_ordinal[o].block,
                             metrics={"replayed_launch": Metric(value=float(o), unit="")})
               for i, o in enumerate(plan.replayed)]
    joined = join_counters(launches, [], deduplicated=False, filtered=True, variants=records,
                           variants_at=plan.replayed)
    assert {o: m["replayed_launch"].value for o, (m, _, _) in joined.counters.items()} == {o: o for o in plan.replayed}
    assert joined.problems == []
    unscoped = join_counters(launches, [], deduplicated=False, filtered=True, variants=records)
    assert set(unscoped.counters) != set(plan.replayed)


def test_a_cudnn_layout_conversion_is_the_same_work_in_any_operator_shape() -> None:
    """cuDNN's transposes around NHWC convolutions: one configuration fixes their work (measured on the H100,
    docs/measurements/h100_variant_replay.json); the convolution kernel of the same operators does not, and an
    element-wise kernel needs equal element counts."""
    from plugins.ncu.keys import same_work

    layout = ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, (bool)0, (bool)1, "
              "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<T3>, const T1 *, T2 *)")
    conv = "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1"
    relu = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::(anonymous namespace)::launch_clamp>"
    a, b = [[32, 128, 56, 56], [128, 128, 3, 3]], [[32, 128, 28, 28], [128, 128, 3, 3]]
    assert same_work(layout, a, b) and same_work(layout.replace("nchwToNhwc", "nhwcToNchw"), a, b)
    assert not same_work(conv, a, b)
    assert not same_work(relu, [[32, 128, 56, 56]], [[32, 128, 28, 28]])
    assert same_work(relu, [[32, 64, 112, 112]], [[32, 256, 56, 56]])
