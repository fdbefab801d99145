"""nsys SQLite export → window kernels in launch order with NVTX stacks, on recorded H200 captures.

Every expected number is read from the export with plain SQL (tests/fixtures_util.py) and pinned below, so a
change of the fixtures and a change of the reader both show.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from fixtures_util import NSYS_RUNS, raw_enclosing_ranges, raw_measure_range, raw_window_kernels, run_dir

from mcp_server.children.contract import MEASURE_RANGE
from plugins.nsys.reader import NsysCapture, NsysExportError, decode_global_tid, read_nsys_sqlite, tables

# Counted with SQL in the recorded exports (nsys 2025.3.1, torch 2.11, H200): every kernel of each capture was
# launched inside the measure range, from the measure range's thread, on device 0, stream 7.
EXPECTED = {
    "conv_block_eager": dict(
        kernels=23, memcpy=0, memset=0, memcpy_bytes=0, sync=3, window=(9945193, 12725138), nvtx=136,
        thread=560, kernel_time_ns=56992,
    ),
    "conv_block_inductor": dict(
        kernels=23, memcpy=0, memset=0, memcpy_bytes=0, sync=3, window=(10651045, 12736436), nvtx=41,
        thread=1122, kernel_time_ns=54784,
    ),
    "gpt2_eager": dict(
        kernels=59, memcpy=2, memset=8, memcpy_bytes=8192, sync=3, window=(10350573, 16660712), nvtx=320,
        thread=2007, kernel_time_ns=148416,
    ),
    "gpt2_inductor": dict(
        kernels=34, memcpy=0, memset=0, memcpy_bytes=0, sync=3, window=(10653323, 12653957), nvtx=36,
        thread=2889, kernel_time_ns=66368,
    ),
}


def _db(run: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_dir(run, tmp_path_factory) / "nsys" / "report.sqlite"


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, Path]:
    """workload -> path of its recorded nsys SQLite export."""
    return {w: _db(w, tmp_path_factory) for w in NSYS_RUNS}


@pytest.fixture(scope="session")
def captures(exports) -> dict[str, NsysCapture]:
    """workload -> NsysCapture of its recorded nsys pass."""
    return {w: read_nsys_sqlite(path) for w, path in exports.items()}


def _count(conn: sqlite3.Connection, table: str, column: str | None, window: tuple[int, int]) -> tuple[int, int]:
    """(rows, sum of `column` or 0) of an activity table whose launching runtime call lies in the window."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
        return 0, 0
    rows, total = conn.execute(
        f"SELECT COUNT(*), {f'COALESCE(SUM(m.{column}), 0)' if column else '0'} FROM {table} m "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId WHERE r.start BETWEEN ? AND ?",
        window,
    ).fetchone()
    return rows, total


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_pinned_numbers_are_those_of_the_raw_export(exports, workload):
    """The pinned expectations, recomputed with SQL from the export itself."""
    want = EXPECTED[workload]
    kernels = raw_window_kernels(exports[workload])
    with sqlite3.connect(f"file:{exports[workload]}?mode=ro", uri=True) as conn:
        start, end, tid = raw_measure_range(conn)
        assert (start, end) == want["window"] and tid & 0xFFFFFF == want["thread"]
        all_kernels = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        assert all_kernels == len(kernels) == want["kernels"]  # the capture range held the window only
        memcpy = _count(conn, "CUPTI_ACTIVITY_KIND_MEMCPY", "bytes", (start, end))
        assert memcpy == (want["memcpy"], want["memcpy_bytes"])
        assert _count(conn, "CUPTI_ACTIVITY_KIND_MEMSET", None, (start, end))[0] == want["memset"]
        assert conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").fetchone()[0] == want["sync"]
        assert conn.execute("SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0] == want["nvtx"]
    assert sum(k.end - k.start for k in kernels) == want["kernel_time_ns"]
    assert {(k.device, k.stream, k.global_tid) for k in kernels} == {(0, 7, tid)}


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_counts_and_window(captures, workload):
    capture, want = captures[workload], EXPECTED[workload]
    assert len(capture.kernels) == want["kernels"]
    assert (capture.memcpy_count, capture.memset_count, capture.memcpy_bytes) == (
        want["memcpy"], want["memset"], want["memcpy_bytes"]
    )
    assert capture.sync_count == want["sync"]
    assert (capture.window_start_ns, capture.window_end_ns) == want["window"]
    assert capture.nvtx_range_count == want["nvtx"]
    assert capture.warnings == []
    assert sum(k.duration_ns for k in capture.kernels) == want["kernel_time_ns"]


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_every_kernel_equals_its_raw_row_in_launch_order(exports, captures, workload):
    """Kernel by kernel, in launch order: the reader's record is the export's row (no kernel dropped or moved)."""
    raw = raw_window_kernels(exports[workload])
    got = [
        (k.ordinal, k.correlation_id, k.name, k.mangled_name, k.start_ns, k.duration_ns, k.device_id, k.stream_id,
         k.grid, k.block, k.registers_per_thread, k.shared_memory_bytes, k.launch_thread, k.launch_start_ns)
        for k in captures[workload].kernels
    ]
    want = [
        (i, r.correlation_id, r.demangled, r.mangled, r.start, r.end - r.start, r.device, r.stream, r.grid, r.block,
         r.registers, r.static_smem + r.dynamic_smem, r.global_tid & 0xFFFFFF, r.api_start)
        for i, r in enumerate(raw)
    ]
    assert got == want


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_stacks_are_the_ranges_enclosing_each_launch(exports, captures, workload):
    """Each kernel's frames are the push/pop ranges open on its thread at its launch call, outermost first."""
    raw = raw_window_kernels(exports[workload])
    with sqlite3.connect(f"file:{exports[workload]}?mode=ro", uri=True) as conn:
        for kernel, row in zip(captures[workload].kernels, raw, strict=True):
            ranges = raw_enclosing_ranges(conn, row.global_tid, row.api_start)
            want = [(s, e, text.removeprefix("module:").split(", ")[0]) for s, e, text in ranges]
            assert [(f.start_ns, f.end_ns, f.name) for f in kernel.stack] == want


@pytest.mark.parametrize("workload", NSYS_RUNS)
def test_every_stack_starts_at_the_measure_range(captures, workload):
    capture = captures[workload]
    for k in capture.kernels:
        outer = k.stack[0]
        assert (outer.kind, outer.name) == ("annotation", MEASURE_RANGE)
        assert (outer.start_ns, outer.end_ns) == (capture.window_start_ns, capture.window_end_ns)


@pytest.mark.parametrize("workload", ["conv_block_eager", "gpt2_eager"])
def test_eager_kernels_have_operator_and_module_frames(captures, workload):
    kernels = captures[workload].kernels
    assert all(any(f.kind == "op" for f in k.stack) for k in kernels)
    without_module = [k.ordinal for k in kernels if not any(f.kind == "module" for f in k.stack)]
    # gpt2's token + position embedding add runs in the root module's forward, which has no hook range.
    assert without_module == ([2] if workload == "gpt2_eager" else [])
    if workload == "gpt2_eager":
        assert [f.name for f in kernels[2].stack] == [MEASURE_RANGE, "aten::add"]


def test_eager_stack_content(captures):
    first = captures["conv_block_eager"].kernels[0]
    assert [(f.kind, f.name) for f in first.stack] == [
        ("annotation", MEASURE_RANGE),
        ("module", "features"),
        ("module", "features.0"),
        ("module", "features.0.conv"),
        ("op", "aten::conv2d"),
        ("op", "aten::convolution"),
        ("op", "aten::_convolution"),
        ("op", "aten::cudnn_convolution"),
    ]
    assert first.stack[4].input_shapes == [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], []]
    last = captures["gpt2_eager"].kernels[-1]
    assert [f.name for f in last.stack] == [MEASURE_RANGE, "lm_head", "aten::linear", "aten::matmul", "aten::mm"]
    assert last.stack[-1].input_shapes == [[32, 64], [64, 1000]]


@pytest.mark.parametrize(("workload", "triton", "extern"), [("conv_block_inductor", 16, 7), ("gpt2_inductor", 17, 17)])
def test_inductor_triton_kernels_sit_in_their_launch_range(exports, captures, workload, triton, extern):
    kernels = captures[workload].kernels
    raw = raw_window_kernels(exports[workload])
    assert sum(1 for r in raw if r.demangled.startswith("triton_")) == triton
    triton_kernels = [k for k in kernels if k.name.startswith("triton_")]
    assert len(triton_kernels) == triton and len(kernels) - triton == extern
    for k in kernels:
        assert [f.name for f in k.stack[:2]] == [MEASURE_RANGE, "Torch-Compiled Region: 0/0"]
        assert k.stack[2].name.startswith("## Call CompiledFxGraph ")
        assert not any(f.kind == "module" for f in k.stack)
        if k in triton_kernels:
            assert (k.stack[-1].kind, k.stack[-1].name) == ("annotation", k.name)
            assert len(k.stack) == 4
        else:  # cuDNN / cuBLAS extern kernels run under the aten op Inductor called
            assert k.stack[-1].kind == "op" and k.stack[-1].name.startswith("aten::")
    assert Counter(f.kind for k in kernels for f in k.stack) == (
        {"annotation": 85, "op": 19} if workload == "conv_block_inductor" else {"annotation": 119, "op": 17}
    )


def test_decode_global_tid(exports):
    with sqlite3.connect(f"file:{exports['conv_block_eager']}?mode=ro", uri=True) as conn:
        _, _, global_tid = raw_measure_range(conn)
    assert global_tid == 281484371952176
    assert decode_global_tid(global_tid) == (560, 560)
    assert decode_global_tid((4242 << 24) | 4243) == (4242, 4243)


def test_tables_yaml_is_versioned():
    assert str(tables()["nsys_version"]) == "2025.3"
    assert tables()["nvtx"]["push_pop_event_type"] == 59


# A tiny export in the nsys 2025.3 schema (only the columns the reader uses), built inline.
T1 = (100 << 24) | 101
T2 = (100 << 24) | 102
_SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,
  correlationId INTEGER, demangledName INTEGER, shortName INTEGER, mangledName INTEGER, registersPerThread INTEGER,
  gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
  staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER,
  nameId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER (start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER,
  nameId INTEGER);
CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT, globalTid INTEGER,
  textId INTEGER, domainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, end INTEGER, correlationId INTEGER, bytes INTEGER);
"""
_STRINGS = [
    (1, "void kernA<float>(float *)"), (2, "kernA"), (3, "_Z5kernAIfEvPT_"),
    (4, "void kernB<float>(float *)"), (5, "kernB"), (6, "_Z5kernBIfEvPT_"),
    (7, "triton_poi_fused_add_0"), (8, "aten::mm, op_id = 3, sizes = [[4, 8], [8, 2]]"),
]
# (launch API start, thread, correlation id, GPU start, stream, kernel string ids): launch order differs from GPU order.
_LAUNCHES = [
    (200, T1, 1, 5000, 13, (1, 2, 3)),   # kernA: launched first on stream 13, runs last
    (600, T1, 2, 800, 14, (4, 5, 6)),    # kernB: launched third on stream 14, runs first
    (50, T1, 3, 60, 13, (1, 2, 3)),      # launched before the measure range: dropped
    (300, T2, 7, 950, 13, (4, 5, 6)),    # launched from a second thread inside the window
    (850, T1, 8, 1200, 13, (1, 2, 3)),   # two nodes of one CUDA graph launch (one correlation id) ...
    (850, T1, 8, 1100, 13, (4, 5, 6)),   # ... ordered by GPU start
]


def _synthetic_export(path: Path, with_measure: bool = True) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA)
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", _STRINGS)
    for api, thread, corr, gpu, stream, (demangled, short, mangled) in _LAUNCHES:
        if corr != 8 or gpu == 1200:
            conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, 0)", (api, api + 5, thread, corr))
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?, ?, ?, 32, 4, 1, 1, 128, 1, 1, 16, 32)",
            (gpu, gpu + 10, stream, corr, demangled, short, mangled),
        )
    # A Triton kernel launched through the driver API (cuLaunchKernel).
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER VALUES (760, 770, ?, 4, 0)", (T1,))
    triton_row = "VALUES (?, ?, 0, 13, ?, 7, 7, 7, 16, 1, 1, 1, 64, 1, 1, 0, 0)"
    conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL {triton_row}", (900, 905, 4))
    # A kernel whose launching call the export lacks: windowed and ordered by its GPU start.
    conn.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL {triton_row}", (990, 999, 99))
    nvtx = [
        (160, 300, 59, "aten::addmm, op_id = 1, sizes = [[2], [4, 8], [8, 2]]", T1, None),
        (150, 400, 59, "module:encoder.layer", T1, None),
        (500, 700, 59, None, T1, 8),  # registered string: text via textId
        (750, 800, 59, "triton_poi_fused_add_0, op_id = 4, sizes = [[4], [4]]", T1, None),
        (100, 2000, 59, "module:other", T2, None),
        (200, None, 34, "a mark, not a range", T1, None),
    ]
    if with_measure:
        nvtx.append((100, 1000, 59, MEASURE_RANGE, T1, None))
    conn.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, ?, 0)", nvtx)
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (650, 660, ?, 5, 0)", (T1,))
    conn.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (1500, 1510, ?, 6, 0)", (T1,))
    memcpy = [(700, 710, 5, 4096), (1600, 1610, 6, 8)]  # launched inside / after the window
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, ?)", memcpy)
    conn.commit()
    conn.close()
    return path


def test_synthetic_launch_order_differs_from_gpu_order(tmp_path):
    capture = read_nsys_sqlite(_synthetic_export(tmp_path / "tiny.sqlite"))
    got = [(k.ordinal, k.correlation_id, k.launch_start_ns, k.start_ns, k.stream_id) for k in capture.kernels]
    assert got == [
        (0, 1, 200, 5000, 13),
        (1, 7, 300, 950, 13),
        (2, 2, 600, 800, 14),
        (3, 4, 760, 900, 13),
        (4, 8, 850, 1100, 13),
        (5, 8, 850, 1200, 13),
        (6, 99, None, 990, 13),
    ]
    by_gpu = [k.ordinal for k in sorted(capture.kernels, key=lambda k: k.start_ns)]
    assert by_gpu == [2, 3, 1, 6, 4, 5, 0]
    stacks = [[(f.kind, f.name) for f in k.stack] for k in capture.kernels]
    assert stacks == [
        [("annotation", MEASURE_RANGE), ("module", "encoder.layer"), ("op", "aten::addmm")],
        [("module", "other")],
        [("annotation", MEASURE_RANGE), ("op", "aten::mm")],
        [("annotation", MEASURE_RANGE), ("annotation", "triton_poi_fused_add_0")],
        [("annotation", MEASURE_RANGE)],
        [("annotation", MEASURE_RANGE)],
        [],
    ]
    first, third = capture.kernels[0], capture.kernels[2]
    assert first.stack[2].input_shapes == [[2], [4, 8], [8, 2]]
    assert third.stack[1].input_shapes == [[4, 8], [8, 2]]
    assert (first.name, first.mangled_name) == ("void kernA<float>(float *)", "_Z5kernAIfEvPT_")
    assert (first.grid, first.block, first.registers_per_thread, first.shared_memory_bytes) == (
        (4, 1, 1), (128, 1, 1), 32, 48
    )
    assert [k.launch_thread for k in capture.kernels] == [101, 102, 101, 101, 101, 101, None]
    assert (capture.window_start_ns, capture.window_end_ns) == (100, 1000)
    assert (capture.memcpy_count, capture.memcpy_bytes, capture.memset_count, capture.sync_count) == (1, 4096, 0, 0)
    assert capture.nvtx_range_count == 6
    assert capture.warnings == [
        "1 kernel(s) launched outside the 'operator_profiler::measure' range were dropped",
        "1 kernel(s) have no launching API call in the export: ordered and windowed by GPU start",
    ]


def test_synthetic_without_measure_range_keeps_everything(tmp_path):
    capture = read_nsys_sqlite(_synthetic_export(tmp_path / "tiny.sqlite", with_measure=False))
    assert [k.correlation_id for k in capture.kernels] == [3, 1, 7, 2, 4, 8, 8, 99]
    assert (capture.window_start_ns, capture.window_end_ns) == (None, None)
    assert capture.memcpy_count == 2 and capture.memcpy_bytes == 4104
    assert capture.warnings[0] == "no 'operator_profiler::measure' NVTX range in the capture: every kernel is kept"


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nsys export"):
        read_nsys_sqlite(tmp_path / "absent.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(NsysExportError, match="SQLite"):
        read_nsys_sqlite(junk)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(NsysExportError, match="StringIds"):
        read_nsys_sqlite(empty)
