"""memory.json's transforms on a small recording shaped as torch writes it (tests/memory_recording.py): the
snapshot reader, the replay of the allocator's history, the attribution of every block, the peak and its holders,
the timeline, the findings, the out-of-memory diagnosis, the chart and the text."""

from __future__ import annotations

import copy
import pickle

import pytest
from memory_recording import (
    BEFORE,
    MIB,
    T0,
    USER,
    WINDOW_BLOCKS,
    WORKLOAD,
    Strings,
    end_snapshot,
    record,
    start_snapshot,
    window_trace,
    write_run,
)

from mcp_server.errors import ProfileFormatError
from mcp_server.memory.attribute import attribute
from mcp_server.memory.build import build_memory
from mcp_server.memory.findings import Peak, block_of, findings
from mcp_server.memory.moments import moment, timeline
from mcp_server.memory.replay import Block, Step, clock_offset_us, replay, rounded, trace_start
from mcp_server.memory.run import write_memory
from mcp_server.memory.snapshot import device_state, device_trace, load_snapshot
from mcp_server.memory.text import memory_lines, oom_lines
from mcp_server.schema.io import read_model
from mcp_server.schema.memory import MemoryProfile, MemoryRecord

PEAK_BYTES = 57 * MIB + MIB // 2  # 17.5 MiB before the window + A1, A2, A3, O, B1 (8 MiB each)


def _replayed(shift_us: int = 0):
    end = end_snapshot(shift_us)
    entries = device_trace(end, 0)
    memory_record = MemoryRecord.model_validate(record())
    offset = clock_offset_us(entries, memory_record.markers, memory_record.marker_bytes)
    return replay(device_state(start_snapshot(), 0), entries, device_state(end, 0), memory_record.marker_bytes,
                  offset), memory_record, offset


def _by_name(blocks):
    addresses = {address: name for name, (address, _) in {**BEFORE, **WINDOW_BLOCKS}.items()}
    return {addresses[a.block.address]: a for a in blocks}


# --------------------------------------------------------------------------------------------- snapshot and replay


def test_a_snapshot_is_read_as_plain_data_and_nothing_else(tmp_path):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(start_snapshot()))
    state = device_state(load_snapshot(path), 0)
    assert sorted(state.blocks) == sorted(address for address, _ in BEFORE.values())
    assert state.reserved_bytes == 80 * MIB
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[ProfileFormatError("x")]]}))
    with pytest.raises(ProfileFormatError, match="holds no objects of classes"):
        load_snapshot(path)
    path.write_bytes(b"not a pickle")
    with pytest.raises(ProfileFormatError, match="is not a memory snapshot"):
        load_snapshot(path)


def test_the_replay_follows_every_block_and_finds_the_peak():
    replayed, memory_record, offset = _replayed()
    assert offset == 0 and replayed.unmatched_frees == 0
    assert rounded(1) == 512 and rounded(2_000_000) == 2_000_384
    peak = replayed.peak(T0, T0 + 1000)
    assert peak.allocated == PEAK_BYTES and peak.time_us == T0 + 515
    assert replayed.steps[0].allocated == 17 * MIB + MIB // 2 and replayed.steps[0].reserved == 80 * MIB
    assert replayed.steps[-1].allocated == 17 * MIB + MIB // 2 + 2 * MIB  # the new gradient, at its block size
    assert max(s.reserved for s in replayed.steps) == 100 * MIB
    live = {b.address for b in replayed.live(peak.index)}
    assert live == {a for a, _ in BEFORE.values()} | {WINDOW_BLOCKS[n][0] for n in ("A1", "A2", "A3", "O", "B1")}
    assert not any(b.requested == 1_234_567 for b in replayed.blocks)  # the harness's markers are not the workload's


def test_the_trace_starts_after_the_start_snapshot_when_the_history_was_not_cleared():
    entries = [{"action": "alloc", "addr": 1, "size": 512, "time_us": 10}, {"action": "snapshot", "time_us": 20},
               {"action": "alloc", "addr": 2, "size": 512, "time_us": 30}]
    assert trace_start(entries, 21, cleared=True) == 0
    assert trace_start(entries, 21, cleared=False) == 2
    assert trace_start(entries[:1] + entries[2:], 25, cleared=None) == 1


def test_the_allocator_clock_is_moved_onto_the_harness_clock_by_the_markers():
    replayed, _, offset = _replayed(shift_us=-3)
    assert offset == 2
    assert replayed.peak().allocated == PEAK_BYTES
    attributed = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(record()), (T0 + 1000) * 1000))
    assert attributed["A2"].operator == "aten::relu" and attributed["A2"].category == "activation"


# --------------------------------------------------------------------------------------------- attribution


def test_every_block_gets_its_category_operator_module_phase_and_line():
    replayed, memory_record, _ = _replayed()
    found = _by_name(attribute(replayed.blocks, memory_record, (T0 + 1000) * 1000))
    expected = {
        "W": ("parameter", "layers.0", None, None), "m": ("optimizer_state", "layers.0", None, None),
        "v": ("optimizer_state", "layers.0", None, None), "G": ("gradient", "layers.0", None, None),
        "R": ("retained", None, None, None), "x": ("input_output", None, None, None),
        "A1": ("activation", "layers.0", "aten::addmm", "forward"),
        "A2": ("activation", "layers.0.act", "aten::relu", "forward"),
        "S": ("workspace", "layers.1", "aten::mm", "forward"), "A3": ("activation", "layers.1", "aten::mm", "forward"),
        "T1": ("temporary", "layers.1", "aten::mul", "forward"),
        "O": ("input_output", "layers.2", "aten::addmm", "forward"),
        "B1": ("temporary", "layers.1", "aten::mm (MmBackward0)", "backward"),
        "C": ("gradient", "layers.1", "aten::mm (MmBackward0)", "backward"),
        "F1": ("temporary", "Model", "aten::_foreach_mul", "optimizer"),
    }
    assert {name: (a.category, a.module, a.operator, a.phase) for name, a in found.items()} == expected
    assert found["A1"].call_site == f"{WORKLOAD}:42"  # the innermost frame of the user's code
    assert found["B1"].call_site is None  # backward: no Python stack, no forward line recorded for the call
    assert found["F1"].call_site == f"{WORKLOAD}:63"  # a library stack: the operator call's own line
    assert found["A1"].dtype == "float32" and found["C"].name == "layers.1.weight.grad"


def test_a_persistent_library_allocation_is_workspace_and_an_unknown_survivor_is_retained():
    replayed, memory_record, _ = _replayed()
    data = record()
    data["ops"][2][8] = []  # aten::mm's output unknown: A3 was kept by the GEMM, like cuBLAS's workspace
    kept = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(data), (T0 + 1000) * 1000))
    assert kept["A3"].category == "workspace"
    data = record()
    data["identities_end"] = data["identities_end"][:-1]  # C is nobody's gradient: held after the window
    held = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(data), (T0 + 1000) * 1000))
    assert held["C"].category == "retained"
    inference = record()
    inference["run_mode"] = "inference"
    forward_only = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(inference), (T0 + 1000) * 1000))
    assert forward_only["A1"].category == "temporary"


# --------------------------------------------------------------------------------------------- the peak, its findings


def _peak():
    replayed, memory_record, _ = _replayed()
    attributed = attribute(replayed.blocks, memory_record, (T0 + 1000) * 1000)
    by_block = {id(a.block): a for a in attributed}
    step = replayed.peak(T0, T0 + 1000)
    return [by_block[id(b)] for b in replayed.live(step.index)], step, replayed


def test_the_moment_groups_the_live_bytes_by_category_module_operator_and_line():
    live, step, _ = _peak()
    at_peak = moment(live, 515, "backward", "aten::mm (MmBackward0)", "layers.1")
    assert at_peak.live_bytes == PEAK_BYTES and at_peak.blocks == 11
    categories = {g.key: g.bytes for g in at_peak.by_category}
    assert categories == {"activation": 24 * MIB, "optimizer_state": 8 * MIB, "input_output": 8 * MIB + MIB // 2,
                          "temporary": 8 * MIB, "parameter": 4 * MIB, "gradient": 4 * MIB, "retained": MIB}
    assert at_peak.attributed_pct == round(100 * (PEAK_BYTES - 1.5 * MIB) / PEAK_BYTES, 2)
    assert sum(g.bytes for g in at_peak.by_module) == PEAK_BYTES
    assert at_peak.holders[0].bytes == 8 * MIB and at_peak.holders[0].share_pct == round(100 * 8 / 57.5, 2)
    assert [g.key for g in at_peak.by_call_site][:1] == [f"{WORKLOAD}:42"]


def test_the_findings_fire_on_the_peak_with_upper_bounds():
    live, _, _ = _peak()
    found = findings(Peak(live, PEAK_BYTES, 58 * MIB, 100 * MIB))
    assert [(f.pattern, f.saving_bytes) for f in found] == [
        ("bf16_activations", 12 * MIB), ("activation_checkpointing", 8 * MIB), ("in_place_ops", 8 * MIB),
        ("zero_grad_set_to_none", 4 * MIB)]
    assert all(f.estimate.startswith("upper bound (estimate)") and f.change for f in found)
    assert found[1].modules == ["layers.0", "layers.1"]
    assert block_of("layers.3.attn.q") == "layers.3" and block_of("head") == "head" and block_of(None) is None


def test_fragmentation_optimizer_state_and_retained_findings():
    live, _, _ = _peak()
    found = {f.pattern: f for f in findings(Peak(live, PEAK_BYTES, 58 * MIB, 4096 * MIB))}
    assert found["expandable_segments"].saving_bytes == 4038 * MIB
    for entry in live:
        if entry.category == "retained":
            entry.block.bytes = 100 * MIB
        if entry.category == "optimizer_state":
            entry.block.bytes = 40 * MIB
    total = sum(e.block.bytes for e in live)
    found = {f.pattern: f for f in findings(Peak(live, total, None, None))}
    assert found["references_across_steps"].saving_bytes == 100 * MIB
    assert found["optimizer_state"].saving_bytes == int(0.75 * 80 * MIB)


def test_the_timeline_is_downsampled_around_an_exact_peak():
    steps = [Step(i, i, (i * 7919) % 1000 + (5000 if i == 4321 else 0), 10_000) for i in range(10_000)]
    points = timeline(steps, 0, None, None, steps[4321], limit=200)
    assert len(points) <= 200 + 1
    assert max(p.allocated_bytes for p in points) == 5000 + (4321 * 7919) % 1000
    assert [p.offset_us for p in points] == sorted(p.offset_us for p in points)


# --------------------------------------------------------------------------------------------- memory.json


def test_memory_json_is_a_pure_function_of_the_run_directory(tmp_path):
    run_dir = write_run(tmp_path / "run", start_snapshot(), end_snapshot(), record())
    profile, chart = write_memory(run_dir)
    again = read_model(run_dir.memory_path, MemoryProfile, "memory.json", "")
    assert again == profile == build_memory(run_dir)
    assert chart is not None and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert profile.peak_allocated_bytes == 58 * MIB and profile.replayed_peak_bytes == PEAK_BYTES
    assert profile.peak_reserved_bytes == 100 * MIB and profile.window_us == 1000
    peak = profile.at_peak
    assert peak is not None and (peak.offset_us, peak.phase, peak.operator, peak.module) == (
        515, "backward", "aten::mm (MmBackward0)", "layers.1")
    assert [(s.phase, s.start_us, s.end_us) for s in profile.phases] == [
        ("forward", 10, 500), ("backward", 500, 800), ("optimizer", 850, 950)]
    assert profile.timeline[0].offset_us == 5 and max(p.allocated_bytes for p in profile.timeline) == PEAK_BYTES
    assert profile.artifacts["snapshot"] == "memory/snapshot.pickle" and profile.oom is None
    lines = memory_lines(profile)
    assert any("layers.1" in line and "aten::mm (MmBackward0)" in line for line in lines)
    assert any("by category: activation 24.00 MiB (42 %)" in line for line in lines)


def _oom_recording():
    """The workload's warm-up fails in layers.3's addmm: a 16 GiB request with 1 GiB free; no window."""
    start = copy.deepcopy(start_snapshot())
    trace = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": T0 - 60, "frames": []}]
    trace += [e for e in window_trace() if e["time_us"] <= T0 + 200 and e["size"] != 1_234_567]
    trace.append({"action": "oom", "device_free": 1024 * MIB, "size": 16 * 1024 * MIB, "stream": 0,
                  "time_us": T0 + 310, "frames": list(USER)})
    end = copy.deepcopy(end_snapshot())
    end["device_traces"] = [trace]
    names = Strings()
    data = record(names)
    data.update(window=None, history_cleared=None, oom={"stage": "warmup", "requested": 16 * 1024 * MIB,
                                                        "device_total": 80 * 1024 * MIB, "device_free": 1024 * MIB,
                                                        "time_ns": (T0 + 311) * 1000},
                stats={"allocated_bytes.all.peak": 50 * MIB}, iterations=[[(T0 + 10) * 1000, (T0 + 320) * 1000]],
                backward=[], optimizer=[])
    data["ops"].append([names.id("aten::addmm"), (T0 + 300) * 1000, (T0 + 330) * 1000, 1, names.id("layers.3"),
                        names.id("forward"), names.id(f"{WORKLOAD}:42"), -1, [], []])
    data["strings"] = names.names
    return start, end, data


def test_an_out_of_memory_failure_says_what_was_allocated_where_and_what_held_the_memory(tmp_path):
    run_dir = write_run(tmp_path / "oom", *_oom_recording())
    profile, _ = write_memory(run_dir)
    oom = profile.oom
    assert oom is not None and oom.stage == "warmup" and oom.requested_bytes == 16 * 1024 * MIB
    assert (oom.operator, oom.module, oom.phase, oom.call_site) == ("aten::addmm", "layers.3", "forward",
                                                                    f"{WORKLOAD}:42")
    assert oom.frames[0] == f"forward ({WORKLOAD}:42)"
    assert oom.held is not None and oom.held.live_bytes == 17 * MIB + MIB // 2 + 32 * MIB  # A1, A2, A3, O
    held = {g.key: g.bytes for g in oom.held.by_category}
    assert held["activation"] == 24 * MIB and held["input_output"] == 8 * MIB + MIB // 2  # in flight at the failure
    screen = oom_lines(profile, oom, run_dir.memory_path, run_dir.memory_snapshot())
    assert screen[0] == (f"out of memory during forward: aten::addmm in layers.3 at {WORKLOAD}:42 asked for "
                         "16.00 GiB; 1.00 GiB free of 80.00 GiB")
    holders = [line for line in screen if line.startswith("   ") and " %  " in line]
    assert len(holders) == 3 and "activation" in holders[0]
    assert "what to change:" in screen and len(screen) <= 25
    assert any("checkpoint the activations" in line for line in screen)


def test_a_call_outside_every_module_takes_the_module_of_what_it_reads():
    """The loss on the model's output: its log-softmax reads O (made by layers.2's addmm) and is attributed there;
    the same call reading nothing a module made keeps no module."""
    names = Strings()
    data = record(names)
    loss_address = 0x7F40_0000_0000
    data["ops"].append([names.id("aten::_log_softmax"), (T0 + 215) * 1000, (T0 + 225) * 1000, 1, -1,
                        names.id("forward"), names.id(f"{WORKLOAD}:62"), -1,
                        [[loss_address, 4 * MIB, names.id("float32")]], [WINDOW_BLOCKS["O"][0]]])
    data["ops"].append([names.id("aten::ones_like"), (T0 + 230) * 1000, (T0 + 232) * 1000, 1, -1,
                        names.id("forward"), names.id(f"{WORKLOAD}:63"), -1, [[loss_address + 4 * MIB, 512, 0]],
                        [0x7F50_0000_0000]])
    data["strings"] = names.names
    memory_record = MemoryRecord.model_validate(data)
    made = [Block(loss_address, 4 * MIB, 4 * MIB, 99, T0 + 220, 0, [], 200, T0 + 540),
            Block(loss_address + 4 * MIB, 512, 4, 100, T0 + 231, 0, [], 201, T0 + 600)]
    loss, ones = attribute(made, memory_record, (T0 + 1000) * 1000)
    assert (loss.category, loss.module, loss.operator, loss.inherited) == (
        "activation", "layers.2", "aten::_log_softmax", True)
    assert (ones.module, ones.inherited) == (None, False)


def test_a_gradient_freed_before_the_window_ends_is_known_from_the_optimizer_step_that_saw_it():
    names = Strings()
    data = record(names)
    data["identities_end"] = data["identities_end"][:-1]  # C freed by zero_grad(set_to_none=True), say
    c_address, c_size = WINDOW_BLOCKS["C"]
    sighting = [c_address, c_size, names.id("layers.1"), names.id("layers.1.weight.grad"), (T0 + 850) * 1000]
    data["gradients"] = [sighting]
    data["strings"] = names.names
    replayed, _, _ = _replayed()
    found = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(data), (T0 + 1000) * 1000))
    assert (found["C"].category, found["C"].module, found["C"].name) == ("gradient", "layers.1", "layers.1.weight.grad")
    data["gradients"] = [[*sighting[:4], (T0 + 600) * 1000]]  # seen before C was allocated: another block's
    found = _by_name(attribute(replayed.blocks, MemoryRecord.model_validate(data), (T0 + 1000) * 1000))
    assert found["C"].category == "retained"
