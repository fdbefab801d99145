"""The replay plan fitted to a budget of replay time (a pure function): configurations first, then shape variants by
the module calls that launch them, spread over the window; left-out variants take the nearest measured shape. On
ResNet-50's recorded timeline (H100) and on a decode-like window of thousands of variants."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures_util import resnet50_nsys

from mcp_server.assemble.aggregate import counter_coverage
from mcp_server.assemble.join import join_counters, launch_position, shape_distance
from mcp_server.capture.budget import budget_note, refitted, spread_order, within_budget
from mcp_server.capture.replay_plan import plan_launches, plan_replays
from mcp_server.capture.variants import variants_options
from mcp_server.schema.profile import Attribution, AttributionMethod, Confidence, KernelRecord, Metric, WindowTotals
from mcp_server.schema.records import CounterRecord
from mcp_server.schema.requests import NcuOptions
from plugins.ncu.command import profile_options, replayed_kernels
from plugins.nsys.ranges import NvtxRange
from plugins.nsys.reader import WindowKernel

EACH_S = 0.3  # the measured cost of one replayed kernel (12 passes x 25 ms on the H100)


@pytest.fixture(scope="module")
def resnet50(tmp_path_factory) -> Path:
    return resnet50_nsys(tmp_path_factory.mktemp("resnet50"))


def test_a_budget_that_holds_everything_changes_nothing(resnet50):
    plan = plan_replays(resnet50)
    fitted = within_budget(plan, NcuOptions().replay_budget_s, EACH_S)
    assert NcuOptions().replay_budget_s == 60.0
    assert (fitted.variants, fitted.calls, fitted.replayed, fitted.variant_names) == (
        plan.variants, plan.calls, plan.replayed, plan.variant_names)
    assert fitted.left_out == [] and fitted.main_limit is None and budget_note(fitted) is None
    assert (plan.configurations + len(plan.replayed)) * EACH_S <= 60.0


def test_resnet50s_variants_under_a_tight_budget(resnet50):
    plan = plan_replays(resnet50)
    room = len(plan.replayed) // 2  # launches left for the variant pass once every configuration is replayed
    fitted = within_budget(plan, (plan.configurations + room) * EACH_S, EACH_S)
    assert fitted.main_limit is None and 0 < len(fitted.replayed) <= room
    assert sorted(fitted.variants + fitted.left_out) == plan.variants and fitted.left_out
    assert fitted.calls is not None and set(fitted.calls) < set(plan.calls or [])
    assert set(fitted.replayed) <= set(plan.replayed) and set(fitted.variants) <= set(fitted.replayed)
    assert f"{len(fitted.variants)} of {len(plan.variants)} shape variants are replayed" in (
        budget_note(fitted) or "")
    assert plan.variants and plan.left_out == [], "the plan itself is kept"
    tiny = within_budget(plan, (plan.configurations - 10) * EACH_S, EACH_S)  # the configurations split
    assert tiny.config_pass and tiny.calls is None and tiny.left_out == plan.variants, "no shape variant replayed"
    alone = within_budget(plan, (plan.configurations - 10) * EACH_S, EACH_S, split=False)
    assert alone.main_limit == plan.configurations - 10 and alone.variants == [] and alone.calls == []
    assert alone.left_out == plan.variants and "until its replay time reaches the budget" in (budget_note(alone) or "")


def test_a_plan_is_fitted_again_at_the_pace_the_ncu_pass_is_measured_to_replay_at(resnet50):
    plan = plan_replays(resnet50)
    budget = (plan.configurations + len(plan.replayed) // 2) * EACH_S
    estimated = within_budget(plan, budget, EACH_S)  # the plan's estimate, before the pass replayed anything
    assert estimated.main_limit is None and estimated.variants and estimated.left_out
    assert refitted(estimated, EACH_S * 1.05) is estimated and refitted(estimated, None) is estimated
    slow = refitted(estimated, 2 * EACH_S)  # a training step's kernels: ncu saves and restores what they write
    assert slow.seconds_each == 2 * EACH_S and slow.budget_s == budget
    assert slow.main_limit == math.floor(budget / (2 * EACH_S)) < plan.configurations
    assert slow.variants == [] and sorted(slow.left_out) == plan.variants
    assert "until its replay time reaches the budget" in (budget_note(slow) or "")
    fast = refitted(slow, EACH_S / 2)  # from the plan itself, not from the one fitted at the slow pace
    assert fast.main_limit is None and fast.variants == plan.variants and fast.left_out == []
    assert plan.unfitted is None and fast.unfitted is plan


def test_the_variant_pass_does_not_run_when_the_measured_pace_leaves_no_room(resnet50, tmp_path):
    from mcp_server.capture.passes import ReplayCount
    from mcp_server.capture.request import CaptureRequest, WorkloadOptions
    from mcp_server.capture.variants import ncu_variants_pass
    from mcp_server.rundir import RunDir

    plan = plan_replays(resnet50)
    budget = (plan.configurations + len(plan.replayed)) * EACH_S
    estimated = within_budget(plan, budget, EACH_S)
    assert estimated.variants == plan.variants, "at the estimate every variant fits"
    replays = ReplayCount()
    for i in range(6):  # the ncu pass, measured: 3 x the estimate per kernel
        replays.replayed(100.0 + 3 * EACH_S * i)
    req = CaptureRequest(workload=tmp_path / "w.py", run_dir=RunDir(tmp_path / "run"), options=WorkloadOptions(),
                         timeout_s=60)
    said: list[str] = []
    record = ncu_variants_pass(req, NcuOptions(replay_budget_s=budget), said.append, replays=replays,
                               plan=estimated)
    assert record is None, "no ncu was run: the configurations take the whole budget at the measured pace"
    assert any("0.90 s per kernel, not the 0.30 s estimated" in line for line in said)
    assert any("not run: the configurations take the whole replay budget" in line for line in said)


def test_spread_order_reaches_both_ends_then_halves():
    assert spread_order(9) == [0, 8, 4, 2, 6, 1, 3, 5, 7]
    assert spread_order(2) == [0, 1] and spread_order(1) == [0] and spread_order(0) == []
    assert sorted(spread_order(48)) == list(range(48)) and spread_order(48)[:3] == [0, 47, 23]


STEPS, LAYERS, KERNELS = 48, 12, 4


def _decode_window() -> list[WindowKernel]:
    """A decode loop: 48 steps, each calling 12 attention modules that launch 4 kernels whose operator shapes grow
    with the KV length (each layer its own head size): 2,300 launches of 4 configurations have unseen shapes."""
    launches, t = [], 0
    for step in range(STEPS):
        for layer in range(LAYERS):
            call = NvtxRange(t, t + 1000, f"module:h.{layer}.attn", t + 1000)
            for kernel in range(KERNELS):
                op = NvtxRange(t + 1 + kernel, t + 2 + kernel,
                               f"aten::bmm, sizes = [[4, 1, {64 + layer}], [4, {64 + layer}, {8 + step}]]",
                               t + 2 + kernel)
                launches.append(WindowKernel(
                    ordinal=len(launches), name=f"gemm{kernel}", mangled_name=f"_Z5gemm{kernel}", start_ns=t + kernel,
                    duration_ns=3_000 + 10 * step, device_id=0, stream_id=7, correlation_id=len(launches),
                    grid=(4, 1, 1), block=(128, 1, 1), registers_per_thread=64, shared_memory_bytes=0,
                    launch_thread=1, launch_start_ns=t + 1 + kernel, stack=(call, op)))
            t += 2000
    return launches


def test_a_decode_window_of_thousands_of_variants_plans_within_the_budget():
    plan = plan_launches(_decode_window())
    assert plan.configurations == KERNELS and len(plan.variants) == STEPS * LAYERS * KERNELS - KERNELS == 2300
    fitted = within_budget(plan, 60.0, EACH_S)
    replays = fitted.configurations + len(fitted.replayed)
    assert replays * EACH_S <= 60.0 and replays == math.floor(60.0 / EACH_S)
    assert len(fitted.variants) + len(fitted.left_out) == 2300 and len(fitted.left_out) > 2000
    chosen: dict[str, set[int]] = {}
    for path, number in fitted.calls or []:
        chosen.setdefault(path, set()).add(number)
    assert set(chosen) == {f"h.{layer}.attn" for layer in range(LAYERS)}, "every layer is measured"
    # representative steps: the first and last steps whose calls hold variants, and the middle one, come first (layer
    # 0's first launches are its configurations' own: its calls hold variants from the second step on)
    assert {1, (1 + STEPS - 1) // 2, STEPS - 1} <= chosen["h.0.attn"]
    for layer in range(1, LAYERS):
        assert {0, (STEPS - 1) // 2, STEPS - 1} <= chosen[f"h.{layer}.attn"]
    assert "spread over the window" in (budget_note(fitted) or "")


def test_the_variant_passs_warm_up_under_ncu_is_paid_from_the_budget():
    plan = plan_launches(_decode_window())
    free = within_budget(plan, 60.0, EACH_S)
    warm_s = 10 * EACH_S + 0.1  # eleven replays' worth: the pass's start is not replay time, but the run waits for it
    paid = within_budget(plan, 60.0, EACH_S, warm_s)
    assert paid.start_s == warm_s and free.start_s == 0.0
    assert len(free.replayed) - 11 - KERNELS < len(paid.replayed) <= len(free.replayed) - 11, "whole module calls"
    assert (paid.configurations + len(paid.replayed)) * EACH_S + warm_s <= 60.0
    assert "the second ncu pass's warm-up under ncu, about 3 s, is paid from the budget" in (budget_note(paid) or "")
    assert refitted(free, EACH_S, warm_s).replayed == paid.replayed, "a warm-up measured later fits the plan again"
    assert refitted(paid, EACH_S, warm_s + 0.1) is paid, "less than a replay's worth: kept"
    none_left = within_budget(plan, 60.0, EACH_S, 60.0 - plan.configurations * EACH_S)
    assert none_left.variants == [] and none_left.main_limit is None, "the configurations keep their budget"

def _with_token_cat(duration_ns: int) -> list[WindowKernel]:
    """The decode window with the loop's own `torch.cat` of each step's token, outside every module call: a variant
    per step (its output grows)."""
    launches = []
    for kernel in _decode_window():
        launches.append(replace(kernel, ordinal=len(launches), correlation_id=len(launches)))
        if kernel.stack[0].text == f"module:h.{LAYERS - 1}.attn" and kernel.name == f"gemm{KERNELS - 1}":
            step = kernel.ordinal // (LAYERS * KERNELS)
            op = NvtxRange(kernel.start_ns + 10, kernel.start_ns + 11, f"aten::cat, sizes = [[4, {8 + step}], [4, 1]]",
                           kernel.start_ns + 11)
            launches.append(replace(kernel, ordinal=len(launches), name="cat", mangled_name="_Z3cat",
                                    correlation_id=len(launches), start_ns=kernel.start_ns + 10,
                                    duration_ns=duration_ns, stack=(op,)))
    return launches


def test_variants_outside_every_module_call_leave_the_plan_scoped_when_they_hold_little():
    """Hugging Face's generate() concatenates each new token outside the model's modules: those few variants are left
    out (nearest measured shape), the attention's are replayed by module calls spread over the window."""
    plan = plan_launches(_with_token_cat(2_000))
    cats = {k.ordinal for k in _with_token_cat(2_000) if k.name == "cat"} & set(plan.variants)
    assert plan.calls is not None and len(cats) == STEPS - 1, "the first step's is its configuration's own"
    fitted = within_budget(plan, 60.0, EACH_S)
    assert fitted.calls and cats <= set(fitted.left_out) and not cats & set(fitted.replayed)
    assert "_Z3cat" not in fitted.variant_names
    assert not cats & set(within_budget(plan, 10_000.0, EACH_S).variants), "unscoped variants are never replayed"


def test_variants_outside_module_calls_holding_most_time_keep_the_run_of_launches():
    plan = plan_launches(_with_token_cat(10_000_000))
    assert plan.calls is None and plan.launch_count > 0


def _sizes(step: int) -> list[list[int]]:
    return [[4, 1, 64], [4, 64, 8 + step]]


def test_left_out_variants_take_the_nearest_measured_shape():
    assert shape_distance(_sizes(37), _sizes(40)) < shape_distance(_sizes(37), _sizes(0))
    assert shape_distance(_sizes(3), _sizes(3)) == 0.0 and shape_distance(_sizes(3), [[1]]) == 100.0
    launches = [k for k in _decode_window() if k.stack[0].text == "module:h.0.attn" and k.name == "gemm0"]
    measured = {0, 40}  # the steps whose launches the variant pass replayed
    records = [CounterRecord(ordinal=i, name=k.name, mangled_name=k.mangled_name, grid=k.grid, block=k.block,
                             metrics={"step": Metric(value=float(step), unit="")})
               for i, (step, k) in enumerate((s, launches[s]) for s in sorted(measured))]
    joined = join_counters(launches, records[:1], deduplicated=True, variants=records[1:],
                           variants_at=[launches[40].ordinal])
    by_step = {step: joined.counters[k.ordinal] for step, k in enumerate(launches)}
    assert by_step[37][0]["step"].value == 40 and by_step[37][1:] == (launches[40].ordinal, "nearest_shape")
    assert by_step[10][0]["step"].value == 0 and by_step[10][2] == "nearest_shape"
    assert by_step[40][1:] == (None, None), "a replayed launch carries its own counters"
    assert any("launches carry the counters of a launch of their configuration with other input shapes" in n
               for n in joined.notes)


def test_the_profile_states_measured_propagated_and_missing_shares():
    attribution = Attribution(method=AttributionMethod.NVTX_ENCLOSURE, confidence=Confidence.MEDIUM)
    metric = {"m": Metric(value=1.0, unit="")}
    kernels = [KernelRecord(kernel_id=0, kernel_name="a", start_ns=0, duration_ns=600, attribution=attribution,
                            metrics=metric),
               KernelRecord(kernel_id=1, kernel_name="a", start_ns=0, duration_ns=200, attribution=attribution,
                            metrics=metric, propagated_from=0, propagation="same_shapes"),
               KernelRecord(kernel_id=2, kernel_name="a", start_ns=0, duration_ns=100, attribution=attribution,
                            metrics=metric, propagated_from=0, propagation="nearest_shape"),
               KernelRecord(kernel_id=3, kernel_name="b", start_ns=0, duration_ns=100, attribution=attribution)]
    window = WindowTotals(wall_time_ns=1)
    counter_coverage(window, kernels)
    assert (window.measured_counter_kernel_time_pct, window.propagated_counter_kernel_time_pct,
            window.nearest_shape_kernel_time_pct, window.no_counter_kernel_time_pct) == (60.0, 30.0, 10.0, 10.0)


def test_the_ncu_pass_stops_once_its_replay_time_passes_the_budget():
    from mcp_server.capture.passes import _over_budget

    line = '==PROF== Profiling "kernel_{}" - {}: 0%....50%....100% - 12 passes'
    reached = _over_budget(budget_s=3600.0)
    assert not any(reached(line.format(i, i)) for i in range(500)), "far from the budget, whatever the count"
    assert not reached("==PROF== Connected to process 1")
    spent = _over_budget(budget_s=0.005)  # two kernels 10 ms apart: about 20 ms of replay
    assert not spent(line.format(0, 0))
    time.sleep(0.01)
    assert spent(line.format(1, 1))


def _configs_in_order(plan) -> list[tuple[object, ...]]:
    seen: dict[tuple[object, ...], int] = {}
    for facts in plan.launch_facts:
        seen.setdefault(facts.config, facts.ordinal)
    return sorted(seen, key=seen.__getitem__)


def _held(plan, configs) -> int:
    wanted = set(configs)
    return sum(f.duration_ns for f in plan.launch_facts if f.config in wanted)


def test_configurations_beyond_the_budget_are_split_by_the_kernel_time_they_hold(resnet50):
    """ResNet-50's configurations under a budget that affords half of them: the ncu pass replays the first ones in
    launch order and stops at a count, a second pass the configurations of the kernels holding the most time among
    the rest; together they cover more kernel time than launch order alone, within the same replays."""
    plan = plan_replays(resnet50)
    order = _configs_in_order(plan)
    affordable = plan.configurations // 2
    fitted = within_budget(plan, affordable * EACH_S, EACH_S, start_s=2 * EACH_S)
    assert fitted.config_pass and fitted.main_limit is not None and fitted.calls is None
    names = set(fitted.variant_names)
    costs = sum(1 for config in order for f in plan.launch_facts if f.config == config and f.ordinal ==
                next(g.ordinal for g in plan.launch_facts if g.config == config) and f.mangled_name in names)
    assert fitted.main_limit + costs + 2 <= affordable, "the second pass's replays and its warm-up fit the budget"
    later = order[fitted.main_limit:]
    first = {c: next(f for f in plan.launch_facts if f.config == c) for c in later}
    assert sorted(fitted.variants) == sorted(first[c].ordinal for c in later if first[c].mangled_name in names)
    covered = _held(plan, order[:fitted.main_limit]) + _held(plan, [c for c in later if first[c].mangled_name in names])
    assert covered > _held(plan, order[:affordable]), "more kernel time than the launch-order prefix it replaces"
    assert fitted.unmeasured == sum(1 for c in later if first[c].mangled_name not in names)
    note = budget_note(fitted) or ""
    assert f"replays the first {fitted.main_limit} in launch order and a second pass" in note
    options = variants_options(NcuOptions(), fitted)
    assert options.per_launch_config and options.kernel_regex == fitted.kernel_regex and options.launch_skip is None
    command = profile_options(Path("report"), options)
    assert "per-launch-config" in command and "regex:" + replayed_kernels(fitted.kernel_regex) in command


def test_a_split_keeps_the_count_the_ncu_pass_was_told_and_never_stops_it_before_what_it_replayed(resnet50):
    plan = plan_replays(resnet50)
    affordable = plan.configurations // 2
    late = within_budget(plan, affordable * EACH_S, EACH_S, replayed=affordable - 3)
    assert late.main_limit is not None and late.main_limit >= affordable - 3
    fitted = within_budget(plan, affordable * EACH_S, EACH_S)
    slow = refitted(fitted, 1.5 * EACH_S)  # measured slower: the told count stays, the second pass shrinks
    assert slow.main_limit == fitted.main_limit and len(slow.variants) < len(fitted.variants)
    unsplit = within_budget(plan, plan.configurations * EACH_S, EACH_S)
    assert not unsplit.config_pass and refitted(unsplit, 2 * EACH_S).variants == []


def test_a_split_under_way_keeps_its_second_pass_when_the_measured_pace_leaves_it_no_room(resnet50):
    """The ncu pass was told to stop at the split's count; the second pass's warm-up, measured later, leaves it no
    room in the budget. Dropping it would leave every configuration after the split without counters (an H200
    ResNet-50 script lost 60 % of its kernel time's counters so): the pass runs as planned, and the note says how far
    past the budget."""
    plan = plan_replays(resnet50)
    affordable = plan.configurations // 2
    fitted = within_budget(plan, affordable * EACH_S, EACH_S)
    assert fitted.config_pass and fitted.past_budget_s == 0.0
    late = refitted(fitted, EACH_S, start_s=affordable * EACH_S)  # a warm-up as long as the whole budget
    assert late.config_pass and late.main_limit == fitted.main_limit
    assert (late.variant_names, late.variants, late.unmeasured) == (
        fitted.variant_names, fitted.variants, fitted.unmeasured)
    assert late.start_s == affordable * EACH_S and late.past_budget_s >= late.start_s - EACH_S
    note = budget_note(late) or ""
    assert f"about {late.past_budget_s:.0f} s past the budget" in note and "told to stop at its split" in note
    room = refitted(fitted, EACH_S, start_s=2 * EACH_S)  # a warm-up it has room for: fitted again, within budget
    assert room.config_pass and room.past_budget_s == 0.0 and "past the budget" not in (budget_note(room) or "")


def test_a_split_plans_second_pass_joins_and_its_counters_reach_every_launch_of_those_configurations(resnet50):
    """The two passes' records as ncu writes them (the first `main_limit` configurations' first launches, the pass
    stopped there; then each configuration of the named kernels once, in launch order) join onto the timeline: every
    launch of a replayed configuration carries counters, those of the other configurations none."""
    from plugins.nsys.reader import read_window

    plan = plan_replays(resnet50)
    fitted = within_budget(plan, plan.configurations // 2 * EACH_S, EACH_S)
    launches = read_window(resnet50, lambda window: list(window.kernels()))
    order = _configs_in_order(plan)
    first = {c: next(k for k in launches if plan.launch_facts[launches.index(k)].config == c) for c in order}
    names = set(fitted.variant_names)

    def record(i: int, kernel: WindowKernel) -> CounterRecord:
        return CounterRecord(ordinal=i, name=kernel.name, mangled_name=kernel.mangled_name, grid=kernel.grid,
                             block=kernel.block, metrics={"m": Metric(value=1.0, unit="")})

    main = [record(i, first[c]) for i, c in enumerate(order[:fitted.main_limit])]
    second = [record(i, first[c]) for i, c in enumerate(c for c in order if first[c].mangled_name in names)]
    regex = variants_options(NcuOptions(), fitted).kernel_regex
    joined = join_counters(launches, main, deduplicated=True, variants=second, truncated=True,
                           variants_start=launch_position(launches, regex, 0))
    assert not joined.problems
    replayed = set(order[:fitted.main_limit]) | {c for c in order if first[c].mangled_name in names}
    configs = {k.ordinal: plan.launch_facts[i].config for i, k in enumerate(launches)}
    assert {o for o in configs if o in joined.counters} == {o for o, c in configs.items() if c in replayed}


def test_the_ncu_pass_stops_at_the_count_a_split_plan_set():
    from mcp_server.capture.passes import ReplayCount, _over_budget

    line = '==PROF== Profiling "kernel_{}" - {}: 0%....50%....100% - 12 passes'
    replays = ReplayCount()
    reached = _over_budget(3600.0, replays)
    assert not any(reached(line.format(i, i)) for i in range(10))
    replays.limit = 12
    assert not reached(line.format(10, 10)) and reached(line.format(11, 11))


def test_a_pass_stopped_at_the_split_says_whether_the_second_pass_carries_the_rest():
    from mcp_server.assemble.nsys import _stopped_early
    from mcp_server.schema.manifest import PassRecord
    from mcp_server.schema.types import SPLIT_NOTE

    def record(note: str) -> PassRecord:
        return PassRecord(name="ncu", profiler="nvtx", command=["ncu"], directory="ncu", started_at="now",
                          wall_time_s=1.0, exit_code=0, stopped_early="condition", notes=[note])

    split = _stopped_early(record(f"{SPLIT_NOTE} the first 10 configurations in launch order"))
    assert "the configurations it replayed and those of the second pass carry counters" in split
    lost = _stopped_early(record(f"{SPLIT_NOTE} the first 68 configurations in launch order"), second_pass=False)
    assert "second pass left no counters" in lost and "configurations after the split carry none" in lost
    alone = _stopped_early(record("stopped at the replay budget (60 s, --replay-budget): the configurations replayed"))
    assert "only the kernels it replayed before then carry counters" in alone
