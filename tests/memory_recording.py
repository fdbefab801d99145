"""A small memory-pass recording written as torch writes it, for the CPU tests of memory.json's transforms.

The snapshots are dicts of the shape `torch.cuda.memory._snapshot()` returns (torch 2.x: `segments` with their
`blocks`, `device_traces` with `action`, `addr`, `size`, `stream`, `time_us`, `frames`, `compile_context`,
`user_metadata`; `allocator_settings`; `external_annotations`), pickled like `_dump_snapshot`; the record has the
fields the memory pass's harness writes (`mcp_server/children/memory.py`). Times are microseconds after T0 (Unix
time, as the allocator's `time_us`), the harness's in nanoseconds of the same clock.

The window is one training step of a two-layer model (`Model`): forward (addmm in layers.0, relu in layers.0.act,
mm with a scratch workspace in layers.1, a temporary mul, the output by layers.2's addmm), backward (a temporary of
MmBackward0 in layers.1, a new gradient), optimizer (a foreach temporary). Before the window: a parameter, two
optimizer-state tensors, a gradient held from the previous step, an unknown retained block and the input.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from mcp_server.rundir import RunDir
from mcp_server.schema.manifest import PassRecord, RunManifest

MIB = 1024 ** 2
T0 = 1_760_000_000_000_000  # microseconds since the epoch
WORKLOAD = "/home/user/project/train.py"
TORCH = "/usr/lib/python3.12/site-packages/torch"
USER = [{"filename": WORKLOAD, "line": 42, "name": "forward"},
        {"filename": f"{TORCH}/nn/modules/module.py", "line": 1775, "name": "_call_impl"},
        {"filename": WORKLOAD, "line": 61, "name": "train_step"}]
LIBRARY = [{"filename": "/usr/lib/python3.12/site-packages/torch/optim/adamw.py", "line": 500, "name": "_multi"}]
ROOTS = ["/usr/lib/python3.12/site-packages/torch/", "/usr/lib/python3.12/"]
MARKER = 1_234_567
SEGMENT = 0x7F00_0000_0000

# name: (address, requested bytes)
BEFORE = {"W": (SEGMENT, 4 * MIB), "m": (SEGMENT + 4 * MIB, 4 * MIB), "v": (SEGMENT + 8 * MIB, 4 * MIB),
          "G": (SEGMENT + 12 * MIB, 4 * MIB), "R": (SEGMENT + 16 * MIB, 1 * MIB), "x": (SEGMENT + 17 * MIB, MIB // 2)}
A = 0x7F10_0000_0000  # the window's blocks
WINDOW_BLOCKS = {"A1": (A, 8 * MIB), "A2": (A + 8 * MIB, 8 * MIB), "S": (A + 16 * MIB, 2 * MIB),
                 "A3": (A + 18 * MIB, 8 * MIB), "T1": (A + 26 * MIB, 4 * MIB), "O": (A + 30 * MIB, 8 * MIB),
                 "B1": (A + 38 * MIB, 8 * MIB), "C": (A + 46 * MIB, 2_000_000), "F1": (A + 48 * MIB, 4 * MIB)}
# (action, block, time after T0 in us): one training step
EVENTS = [("alloc", "A1", 110), ("alloc", "A2", 135), ("alloc", "S", 155), ("alloc", "A3", 160), ("free", "S", 165),
          ("alloc", "T1", 180), ("free", "T1", 190), ("alloc", "O", 200), ("segment_alloc", None, 510),
          ("alloc", "B1", 515), ("free", "A3", 520), ("free", "A2", 550), ("free", "B1", 560), ("free", "A1", 600),
          ("alloc", "C", 700), ("alloc", "F1", 860), ("free", "F1", 900), ("free", "O", 950)]
# [op, start, end (us after T0), module, phase, call site, autograd node, [(block, dtype), ...] of its outputs]
OPS: list[tuple[str, int, int, str | None, str, str | None, str | None, list[tuple[str, str]]]] = [
    ("aten::addmm", 100, 120, "layers.0", "forward", f"{WORKLOAD}:42", None, [("A1", "float32")]),
    ("aten::relu", 130, 140, "layers.0.act", "forward", f"{WORKLOAD}:43", None, [("A2", "float32")]),
    ("aten::mm", 150, 170, "layers.1", "forward", f"{WORKLOAD}:44", None, [("A3", "float32")]),
    ("aten::mul", 175, 192, "layers.1", "forward", f"{WORKLOAD}:45", None, []),
    ("aten::addmm", 195, 210, "layers.2", "forward", f"{WORKLOAD}:46", None, [("O", "float32")]),
    ("aten::mm", 510, 530, "layers.1", "backward", None, "MmBackward0", [("B1", "float32")]),
    ("aten::mm", 690, 710, "layers.1", "backward", None, "MmBackward0", [("C", "float32")]),
    ("aten::_foreach_mul", 855, 905, None, "optimizer", f"{WORKLOAD}:63", None, []),
]


class Strings:
    def __init__(self) -> None:
        self.names: list[str] = []

    def id(self, name: str | None) -> int:
        if name is None:
            return -1
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)


def _ns(us: int) -> int:
    return (T0 + us) * 1000


def _block(address: int, size: int, requested: int, state: str = "active_allocated") -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": requested, "state": state, "frames": list(USER)}


def _segment(address: int, total: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    used = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": address, "total_size": total, "allocated_size": used, "active_size": used,
            "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}


def _entry(action: str, address: int, size: int, at_us: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    key = "device_free" if action == "oom" else "addr"
    return {"action": action, key: address, "size": size, "stream": 0, "time_us": T0 + at_us, "frames": frames,
            "compile_context": "N/A", "user_metadata": ""}


def _snapshot(segments: list[dict[str, Any]], trace: list[dict[str, Any]]) -> dict[str, Any]:
    return {"segments": segments, "device_traces": [trace], "external_annotations": [],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}}


def start_snapshot() -> dict[str, Any]:
    """The state before the window: one 80 MiB segment holding the blocks of BEFORE."""
    blocks = [_block(a, n, n) for a, n in BEFORE.values()]
    blocks.append(_block(SEGMENT + 17 * MIB + MIB // 2, 80 * MIB - (17 * MIB + MIB // 2), 0, "inactive"))
    return _snapshot([_segment(SEGMENT, 80 * MIB, blocks)], [])


def window_trace(shift_us: int = 0) -> list[dict[str, Any]]:
    """The window's history: the start marker, EVENTS, the end marker (times moved by `shift_us`)."""
    trace = [_entry("alloc", 0x7F20_0000_0000, MARKER, 5 + shift_us, list(USER)),
             _entry("free_requested", 0x7F20_0000_0000, MARKER, 6 + shift_us, list(USER)),
             _entry("free_completed", 0x7F20_0000_0000, MARKER, 6 + shift_us, [])]
    for action, name, at in EVENTS:
        if action == "segment_alloc":
            trace.append(_entry("segment_alloc", 0x7F30_0000_0000, 20 * MIB, at + shift_us, []))
            continue
        address, size = WINDOW_BLOCKS[str(name)]
        frames = list(LIBRARY) if name == "F1" else [] if name in ("B1", "C") else list(USER)
        if action == "alloc":
            trace.append(_entry("alloc", address, size, at + shift_us, frames))
        else:
            trace.append(_entry("free_requested", address, size, at + shift_us, frames))
            trace.append(_entry("free_completed", address, size, at + shift_us, []))
    trace.append(_entry("alloc", 0x7F20_0000_0000, MARKER, 1010 + shift_us, list(USER)))
    trace.append(_entry("free_requested", 0x7F20_0000_0000, MARKER, 1011 + shift_us, list(USER)))
    return trace


def end_snapshot(shift_us: int = 0) -> dict[str, Any]:
    """After the window: BEFORE's blocks and the new gradient C (a 2 MiB block for its 2,000,000-byte request)."""
    blocks = [_block(a, n, n) for a, n in BEFORE.values()]
    c_address, c_size = WINDOW_BLOCKS["C"]
    return _snapshot([_segment(SEGMENT, 80 * MIB, blocks),
                      _segment(A, 100 * MIB, [_block(c_address, 2 * MIB, c_size)])], window_trace(shift_us))


def record(strings: Strings | None = None) -> dict[str, Any]:
    """memory_record.json of the window."""
    s = strings or Strings()
    ops = [[s.id(name), _ns(start), _ns(end), 1, s.id(module), s.id(phase), s.id(site), s.id(node),
            [[WINDOW_BLOCKS[b][0], WINDOW_BLOCKS[b][1], s.id(dtype)] for b, dtype in outputs], []]
           for name, start, end, module, phase, site, node, outputs in OPS]
    identity = {"W": ("parameter", "layers.0", "layers.0.weight"), "m": ("optimizer_state", "layers.0",
                "layers.0.weight.exp_avg"), "v": ("optimizer_state", "layers.0", "layers.0.weight.exp_avg_sq"),
                "G": ("gradient", "layers.0", "layers.0.weight.grad")}
    start_rows = [[BEFORE[k][0], BEFORE[k][1], s.id(c), s.id(m), s.id(n)] for k, (c, m, n) in identity.items()]
    start_rows.append([BEFORE["x"][0], BEFORE["x"][1], s.id("input_output"), -1, s.id("input[0]")])
    end_rows = [*start_rows, [WINDOW_BLOCKS["C"][0], 2 * MIB, s.id("gradient"), s.id("layers.1"),
                              s.id("layers.1.weight.grad")]]
    return {
        "version": 1, "clock": "time.time_ns", "device": 0, "device_name": "NVIDIA H100 80GB HBM3",
        "total_memory": 80 * 1024 * MIB, "root_module": "Model", "compile_mode": "eager", "run_mode": "train_step",
        "strings": s.names, "ops": ops, "backward": [[_ns(500), _ns(800)]], "optimizer": [[_ns(850), _ns(950)]],
        "iterations": [[_ns(10), _ns(990)]], "window": [_ns(0), _ns(1000)], "start_snapshot_ns": _ns(-50),
        "end_snapshot_ns": _ns(1100), "markers": [[_ns(4) + 500, _ns(6)], [_ns(1009) + 700, _ns(1012)]],
        "marker_bytes": MARKER, "identities_start": start_rows, "identities_end": end_rows,
        "outputs": [[WINDOW_BLOCKS["O"][0], WINDOW_BLOCKS["O"][1], _ns(212)]],
        "stats": {"allocated_bytes.all.peak": 58 * MIB, "reserved_bytes.all.peak": 100 * MIB,
                  "requested_bytes.all.peak": 57 * MIB + MIB // 2},
        "library_roots": ROOTS, "oom": None, "cublas_workspaces_cleared": True, "history_cleared": True,
    }


def write_run(folder: Path, start: dict[str, Any], end: dict[str, Any], memory_record: dict[str, Any]) -> RunDir:
    """A run directory holding the memory pass alone, as `operator-profiler memory` leaves it."""
    run_dir = RunDir(folder)
    run_dir.pass_dir("memory").mkdir(parents=True, exist_ok=True)
    for path, data in ((run_dir.memory_snapshot(start=True), start), (run_dir.memory_snapshot(), end)):
        path.write_bytes(pickle.dumps(data, protocol=4))
    run_dir.memory_record().write_text(json.dumps(memory_record), encoding="utf-8")
    run_dir.harness_result("memory").write_text(json.dumps({"status": "ok", "environment": {
        "torch_version": "2.11.0+cu130"}}), encoding="utf-8")
    manifest = RunManifest(
        created_at="2026-12-01T00:00:00+00:00", workload=WORKLOAD, python="/usr/bin/python3", backend="memory",
        compile_mode="eager", run_mode="train_step", warmup_iters=1, iters=1, seed=0,
        command_line=["operator-profiler", "memory", WORKLOAD, "--train-step"],
        passes=[PassRecord(name="memory", profiler="memory", command=["python", "harness.py"], directory="memory",
                           started_at="2026-12-01T00:00:01+00:00", wall_time_s=9.5, exit_code=0)])
    run_dir.write_manifest(manifest)
    return run_dir
