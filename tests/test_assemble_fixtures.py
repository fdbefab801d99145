"""`assemble` (and `operator-profiler assemble`) on every recorded H200 run directory, checked against the raw data.

Kernel counts, durations, counters, operator grouping and module paths are recomputed here from the raw artifacts
with SQL, json and ncu_report (tests/fixtures_util.py), never taken from the pipeline's own output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fixtures_util import (
    ALL_RUNS,
    NSYS_RUNS,
    SIZES,
    TORCH_RUNS,
    RawAction,
    RawKernel,
    RawTrace,
    enclosing,
    interval_union,
    is_op_name,
    kernels_of,
    match_in_launch_order,
    ns,
    raw_call_sites,
    raw_enclosing_ranges,
    raw_innermost_sizes,
    raw_measure_range,
    raw_ncu_actions,
    raw_node_modules,
    raw_trace,
    raw_window_kernels,
    run_dir,
)

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import SCHEMA_VERSION, OperatorAttributedProfile
from plugins.ncu.command import default_metrics

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "schemas" / "profile.schema.json"
INDUCTOR = ["conv_block_inductor", "gpt2_inductor", "conv_block_inductor_torch", "gpt2_inductor_torch"]
# Window kernels per run (counted in the raw SQLite / Kineto trace by tests/test_nsys_reader.py and
# tests/test_kineto_reader.py, and again below).
KERNELS = {
    "conv_block_eager": 23, "conv_block_inductor": 23, "gpt2_eager": 59, "gpt2_inductor": 34,
    "conv_block_eager_torch": 23, "conv_block_inductor_torch": 23, "gpt2_eager_torch": 59, "gpt2_inductor_torch": 34,
    "conv_block_eager_train_torch": 84, "gpt2_eager_full_torch": 233,
}
# The documented exception to 0..100 %: `l1tex__throughput.avg.pct_of_peak_sustained_active` is relative to active
# cycles and passes 100 on 1-block kernels: conv_block inductor's weight-layout Triton kernel (118.5 %), gpt2 eager's
# cuBLAS scal_kernel (171.2 %, replayed at launches 17 and 26, propagated to 44 and 53) and a 1-block elementwise
# kernel (104.1 %, launch 10, propagated to 37).
L1_OVER_100 = {"conv_block_inductor": [1], "gpt2_eager": [10, 17, 26, 37, 44, 53]}
# (operator_id, correlation ids of its kernels, input shapes)
Expected = tuple[str, list[int], Any]
TARGET_ATTRIBUTED_PCT = 99.5  # issue 3: window kernel time attributed to an aten op or fused-op group
TARGET_HIGH_PCT = 99.0  # issue 2: gpt2 under torch.profiler, kernel time attributed with confidence high


@pytest.fixture(scope="session")
def dirs(tmp_path_factory) -> dict[str, Path]:
    """run -> extracted run directory."""
    return {r: run_dir(r, tmp_path_factory) for r in ALL_RUNS}


@pytest.fixture(scope="session")
def profiles(dirs) -> dict[str, OperatorAttributedProfile]:
    """run -> the profile `assemble` rebuilds from it."""
    return {r: assemble(RunDir(d)) for r, d in dirs.items()}


@pytest.fixture(scope="session")
def raw_sqlite(dirs) -> dict[str, list[RawKernel]]:
    """nsys run -> window kernels read with SQL, in launch order."""
    return {r: raw_window_kernels(dirs[r] / "nsys" / "report.sqlite") for r in NSYS_RUNS}


@pytest.fixture(scope="session")
def raw_kineto(dirs) -> dict[str, RawTrace]:
    """torch run -> its Kineto trace with exact decimals."""
    return {r: raw_trace(dirs[r] / "torch" / "kineto_trace.json") for r in TORCH_RUNS}


@pytest.fixture(scope="session")
def raw_ncu(dirs) -> dict[str, list[RawAction]]:
    """nsys run -> the ncu report's actions read with ncu_report, every default metric."""
    names = list(default_metrics().values())
    return {r: raw_ncu_actions(dirs[r] / "ncu" / "report.ncu-rep", names) for r in NSYS_RUNS}


@pytest.fixture(scope="session")
def raw_variants(dirs) -> dict[str, tuple[list[RawAction], str, int]]:
    """nsys run -> the shape-variant pass's actions, its --kernel-name regex and --launch-skip (when it ran)."""
    names = list(default_metrics().values())
    out = {}
    for r in NSYS_RUNS:
        report = dirs[r] / "ncu_variants" / "report.ncu-rep"
        if report.is_file():
            command = next(p["command"] for p in json.loads((dirs[r] / "manifest.json").read_text())["passes"]
                           if p["name"] == "ncu_variants")
            regex = command[command.index("--kernel-name") + 1].removeprefix("regex:")
            out[r] = (raw_ncu_actions(report, names), regex, int(command[command.index("--launch-skip") + 1]))
    return out


def raw_durations(run: str, raw_sqlite: dict, raw_kineto: dict) -> dict[int, int]:
    """correlation id -> duration in ns, from the raw artifact."""
    if run in NSYS_RUNS:
        return {k.correlation_id: k.end - k.start for k in raw_sqlite[run]}
    return {int(e["args"]["correlation"]): ns(e["dur"]) for e in raw_kineto[run].of("kernel")}


@pytest.mark.parametrize("run", ALL_RUNS)
def test_every_raw_window_kernel_is_in_the_profile_once(profiles, raw_sqlite, raw_kineto, run):
    profile = profiles[run]
    raw = raw_durations(run, raw_sqlite, raw_kineto)
    kernels = kernels_of(profile)
    assert len(raw) == KERNELS[run] == profile.window.kernel_count == len(kernels)
    assert [k.kernel_id for k in kernels] == list(range(len(kernels)))
    assert sorted(k.correlation_id for k in kernels) == sorted(raw)


@pytest.mark.parametrize("run", ALL_RUNS)
def test_durations_are_the_raw_nanoseconds(profiles, raw_sqlite, raw_kineto, run):
    """nsys: end - start of the same SQLite row; Kineto: `dur` microseconds times 1000."""
    raw = raw_durations(run, raw_sqlite, raw_kineto)
    kernels = kernels_of(profiles[run])
    assert {k.correlation_id: k.duration_ns for k in kernels} == raw
    assert profiles[run].window.kernel_time_ns == sum(raw.values())


@pytest.mark.parametrize("run", NSYS_RUNS)
def test_nsys_kernel_times_and_geometry_are_the_raw_rows(dirs, profiles, raw_sqlite, run):
    """start_ns counts from the measure range's start; launch geometry is the SQLite row's."""
    with sqlite3.connect(f"file:{dirs[run] / 'nsys' / 'report.sqlite'}?mode=ro", uri=True) as conn:
        window_start, _, _ = raw_measure_range(conn)
    for kernel, row in zip(kernels_of(profiles[run]), raw_sqlite[run], strict=True):
        assert kernel.correlation_id == row.correlation_id
        assert (kernel.start_ns, kernel.duration_ns) == (row.start - window_start, row.end - row.start)
        assert (kernel.grid, kernel.block, kernel.stream_id) == (row.grid, row.block, row.stream)
        assert (kernel.kernel_name, kernel.mangled_name) == (row.demangled, row.mangled)


@pytest.mark.parametrize("run", NSYS_RUNS)
def test_gpu_busy_time_is_the_union_of_raw_kernel_intervals(profiles, raw_sqlite, run):
    busy = interval_union([(k.start, k.end) for k in raw_sqlite[run]])
    assert profiles[run].window.gpu_busy_time_ns == busy


@pytest.mark.parametrize("run", ALL_RUNS)
def test_all_kernel_time_is_attributed_without_warnings(profiles, run):
    profile = profiles[run]
    assert profile.window.attributed_kernel_time_pct >= TARGET_ATTRIBUTED_PCT
    assert profile.window.attributed_kernel_time_pct == 100.0
    assert profile.unattributed_kernels == []
    # a training step's backward kernels carry their forward op's module: nothing is warned
    assert profile.warnings == []


@pytest.mark.parametrize("run", ALL_RUNS)
def test_operator_aggregates_add_up(profiles, run):
    profile = profiles[run]
    window = profile.window
    for op in profile.operators:
        assert op.kernels, op.operator_id
        assert op.aggregated.total_duration_ns == sum(k.duration_ns for k in op.kernels)
        assert op.aggregated.kernel_count == len(op.kernels)
        assert op.aggregated.dominant_kernel == max(op.kernels, key=lambda k: k.duration_ns).kernel_name
    operator_time = sum(op.aggregated.total_duration_ns for op in profile.operators)
    assert operator_time + sum(k.duration_ns for k in profile.unattributed_kernels) == window.kernel_time_ns
    assert window.gpu_busy_time_ns <= window.kernel_time_ns
    assert window.operator_count == len(profile.operators)


@pytest.mark.parametrize("run", ALL_RUNS)
def test_operator_identity_is_name_and_call_index_in_window_order(profiles, run):
    operators = profiles[run].operators
    firsts = [min(k.kernel_id for k in op.kernels) for op in operators]
    assert firsts == sorted(firsts)
    seen: dict[str, int] = {}
    for op in operators:
        assert (op.operator_id, op.call_index) == (f"{op.operator_name}#{seen.get(op.operator_name, 0)}",
                                                   seen.get(op.operator_name, 0))
        seen[op.operator_name] = op.call_index + 1


def _expected_nsys_operators(db: Path, raw: list[RawKernel]) -> list[Expected]:
    """Operator calls from the raw NVTX ranges: the outermost op range around each launch (its `sizes` field the
    input shapes), or the Triton kernel itself."""
    calls: dict[Any, tuple[str, list[int], Any]] = {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        for k in raw:
            ranges = raw_enclosing_ranges(conn, k.global_tid, k.api_start)
            ops = [(s, e, text) for s, e, text in ranges if is_op_name(text.split(", ")[0])]
            if ops:
                key: Any = (k.global_tid, ops[0])
                sizes = SIZES.search(ops[0][2])
                name, shapes = ops[0][2].split(", ")[0], json.loads(sizes.group(1)) if sizes else None
            else:
                assert ranges[-1][2].split(", ")[0] == k.demangled and k.demangled.startswith("triton_")
                key, name, shapes = ("fused", k.correlation_id), k.demangled, None
            calls.setdefault(key, (name, [], shapes))[1].append(k.correlation_id)
    return _numbered(list(calls.values()))


def _expected_kineto_operators(trace: RawTrace) -> list[Expected]:
    """Operator calls from the raw trace: the outermost cpu_op around each launch (its `Input Dims` the input
    shapes), or the Triton kernel itself."""
    calls: dict[Any, tuple[str, list[int], Any]] = {}
    launches, cpu_ops = trace.launches, trace.of("cpu_op")
    for event in trace.kernels_in_launch_order():
        corr = int(event["args"]["correlation"])
        launch = launches[corr]
        ops = [e for e in enclosing(cpu_ops, launch["tid"], launch["ts"]) if is_op_name(e["name"])]
        if ops:
            key: Any = id(ops[0])
            name, shapes = ops[0]["name"], ops[0]["args"]["Input Dims"]
        else:
            assert trace.ops_by_external_id[int(event["args"]["External id"])]["name"] == event["name"]
            key, name, shapes = ("fused", corr), event["name"], None
        calls.setdefault(key, (name, [], shapes))[1].append(corr)
    return _numbered(list(calls.values()))


def _numbered(calls: list[tuple[str, list[int], Any]]) -> list[Expected]:
    seen: dict[str, int] = {}
    out = []
    for name, corrs, shapes in calls:
        out.append((f"{name}#{seen.get(name, 0)}", corrs, shapes))
        seen[name] = seen.get(name, 0) + 1
    return out


@pytest.mark.parametrize("run", ALL_RUNS)
def test_operators_are_the_raw_outermost_operator_calls(dirs, profiles, raw_sqlite, raw_kineto, run):
    """Each operator holds exactly the launches made inside one outermost operator range (or one Triton launch),
    with that range's input shapes."""
    if run in NSYS_RUNS:
        want = _expected_nsys_operators(dirs[run] / "nsys" / "report.sqlite", raw_sqlite[run])
    else:
        want = _expected_kineto_operators(raw_kineto[run])
    got = [(op.operator_id, [k.correlation_id for k in op.kernels], op.input_shapes) for op in profiles[run].operators]
    assert got == want


@pytest.mark.parametrize("run", NSYS_RUNS)
def test_every_kernel_carries_the_ncu_counters_of_its_launch(dirs, profiles, raw_sqlite, raw_ncu, raw_variants, run):
    """Counters equal the raw ncu values of the record replayed at that launch (by the deduplicated pass or the
    shape-variant pass), or, for a launch replayed by neither, of an earlier replayed launch of the same (name,
    grid, block) whose launching call had the same input shapes, named by `propagated_from`."""
    profile, raw, actions = profiles[run], raw_sqlite[run], raw_ncu[run]
    kernels = kernels_of(profile)
    assert profile.window.kernels_with_counters == profile.window.kernel_count == len(kernels)
    replayed = dict(zip(match_in_launch_order(actions, raw), actions, strict=True))
    if run in raw_variants:
        variant_actions, regex, skip = raw_variants[run]
        matching = [j for j, row in enumerate(raw) if re.search(regex, row.mangled)]
        start = matching[skip]
        later = match_in_launch_order(variant_actions, raw[start:])
        replayed.update({start + j: a for j, a in zip(later, variant_actions, strict=True)})
    sizes = raw_innermost_sizes(dirs[run] / "nsys" / "report.sqlite", raw)
    names = default_metrics()
    propagated = 0
    for j, (kernel, row) in enumerate(zip(kernels, raw, strict=True)):
        assert kernel.correlation_id == row.correlation_id
        if j in replayed:
            assert kernel.propagated_from is None
            action = replayed[j]
        else:
            source = kernel.propagated_from
            assert source in replayed and source < j and raw[source].config == row.config
            assert sizes[source] == sizes[j], "a launch of other input shapes was not replayed"
            action, propagated = replayed[source], propagated + 1
        assert {key: (m.value, m.unit) for key, m in kernel.metrics.items()} == {
            key: action.values[name] for key, name in names.items()
        }
        assert kernel.metrics["dram_bytes_read"].unit == "byte"
        assert kernel.metrics["dram_bytes_read"].value == action.values["dram__bytes_read.sum"][0]
    assert propagated == len(kernels) - len(replayed)


@pytest.mark.parametrize("run", NSYS_RUNS)
def test_percentages_are_percentages(profiles, run):
    over = []
    for k in kernels_of(profiles[run]):
        for key, metric in k.metrics.items():
            if metric.unit != "%":
                continue
            assert metric.value >= 0, (k.kernel_id, key)
            if metric.value > 100:
                assert key == "l1_throughput_pct", (k.kernel_id, key, metric.value)
                over.append(k.kernel_id)
    assert over == L1_OVER_100.get(run, [])
    for op in profiles[run].operators:
        agg = op.aggregated
        for value in (agg.achieved_occupancy_pct, agg.tensor_core_active_pct, agg.l1_hit_rate_pct,
                      agg.l2_hit_rate_pct, agg.sm_throughput_pct, agg.dram_throughput_pct):
            assert value is not None and 0 <= value <= 100
        assert agg.dram_bytes_read == sum(k.metrics["dram_bytes_read"].value for k in op.kernels)


@pytest.mark.parametrize("run", INDUCTOR)
def test_inductor_operators_have_fused_ops_and_module_paths(profiles, run):
    operators = profiles[run].operators
    fused = [op for op in operators if op.is_fused]
    assert len(fused) == (16 if run.startswith("conv_block") else 17)
    for op in fused:
        assert op.fused_operators and all(is_op_name(name) for name in op.fused_operators)
        assert op.module_path and op.operator_name.startswith("triton_")
    for op in operators:
        assert op.module_path, op.operator_id


@pytest.mark.parametrize("run", INDUCTOR)
def test_library_kernels_in_compiled_graphs_have_their_fx_node_module(dirs, profiles, run):
    """The n-th extern call of an op in the generated call() is the op's n-th operator call; its module is that
    of the call's own FX node (the last source node Inductor lists above it)."""
    pass_dir = dirs[run] / ("torch" if run.endswith("_torch") else "nsys")
    modules = raw_node_modules(pass_dir)
    externs = [(name, modules[nodes[-1]]) for kind, name, nodes in raw_call_sites(pass_dir) if kind == "extern"]
    got = [(op.operator_name, op.module_path) for op in profiles[run].operators if not op.is_fused]
    assert got == externs
    if run.startswith("conv_block"):
        assert got == [("aten::convolution", f"features.{i}.conv") for i in (0, 1, 3, 4, 6, 7)] + [
            ("aten::addmm", "classifier")
        ]
        assert profiles[run].operators[2].operator_id == "aten::convolution#0"


def _outside(paths: set[str], module_path: str) -> list[str]:
    """Paths neither equal to nor inside any of the (comma-separated) module paths."""
    allowed = module_path.split(",")
    return sorted(p for p in paths if not any(p == a or p.startswith(a + ".") for a in allowed))


@pytest.mark.parametrize("run", INDUCTOR)
def test_each_triton_launch_takes_the_module_of_its_own_call_site(dirs, profiles, run):
    pass_dir = dirs[run] / ("torch" if run.endswith("_torch") else "nsys")
    modules = raw_node_modules(pass_dir)
    sites = [(name, {modules[n] for n in nodes if n in modules}) for kind, name, nodes in raw_call_sites(pass_dir)
             if kind == "triton"]
    fused = [op for op in profiles[run].operators if op.is_fused]
    assert [op.operator_name for op in fused] == [name for name, _ in sites]
    wrong = {op.operator_id: _outside(paths, op.module_path) for op, (_, paths) in zip(fused, sites, strict=True)}
    assert {op_id: paths for op_id, paths in wrong.items() if paths} == {}


def test_gpt2_full_eager_under_torch_profiler_is_high_confidence(profiles):
    """Issue 2's acceptance figure: >= 99 % of window kernel time attributed to aten ops with confidence high."""
    window = profiles["gpt2_eager_full_torch"].window
    print(f"\ngpt2 eager (full size) under torch.profiler: {window.kernel_count} kernels, "
          f"{window.kernel_time_ns} ns, high confidence {window.high_confidence_kernel_time_pct:.2f} % of kernel time")
    assert window.high_confidence_kernel_time_pct >= TARGET_HIGH_PCT


@pytest.mark.parametrize("run", ALL_RUNS)
def test_capture_metadata(dirs, profiles, run):
    meta = profiles[run].capture_metadata
    manifest = json.loads((dirs[run] / "manifest.json").read_text(encoding="utf-8"))
    pass_name = "nsys" if run in NSYS_RUNS else "torch"
    harness = json.loads((dirs[run] / pass_name / "harness.json").read_text(encoding="utf-8"))
    assert (meta.device_name, meta.sm_count, meta.gpu_used, meta.device_type) == ("NVIDIA H200", 132, True, "cuda")
    assert meta.torch_version == harness["environment"]["torch_version"] == "2.11.0+cu130"
    assert meta.compile_mode == manifest["compile_mode"] == ("inductor" if "inductor" in run else "eager")
    assert meta.run_mode == ("train_step" if "_train" in run else "inference") == manifest["run_mode"]
    assert meta.tool == ("nsys+ncu" if run in NSYS_RUNS else "torch_profiler")
    assert meta.driver_version == manifest["gpu"]["driver_version"]
    assert meta.notes == []
    window = profiles[run].window
    assert (window.wall_time_ns, window.gpu_elapsed_ns) == (
        harness["window"]["wall_time_ns"], harness["window"]["gpu_elapsed_ns"]
    )


@pytest.mark.parametrize("run", ALL_RUNS)
def test_profile_validates_against_the_published_schema(profiles, run):
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.validate(profiles[run].model_dump(mode="json"), schema)


@pytest.mark.parametrize("run", ["conv_block_inductor", "gpt2_eager_torch"])
def test_cli_assemble_rebuilds_profile_json_without_a_gpu(dirs, profiles, tmp_path, run):
    copy = shutil.copytree(dirs[run], tmp_path / run)
    (copy / "profile.json").unlink(missing_ok=True)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "mcp_server.cli", "assemble", str(copy)],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((copy / "profile.json").read_text(encoding="utf-8"))
    jsonschema.validate(written, json.loads(SCHEMA.read_text(encoding="utf-8")))
    assert written == profiles[run].model_dump(mode="json")
    assert written["window"]["kernel_count"] == KERNELS[run]
    assert f"kernels: {KERNELS[run]}," in done.stdout
    # how the kernel time was attributed: nsys's NVTX ranges carry no correlation id (medium confidence only);
    # torch.profiler links each launch to its op by one (high)
    window = profiles[run].window
    high = window.high_confidence_kernel_time_pct or 0.0
    assert (high == 0.0) == (run == "conv_block_inductor")
    medium = (window.attributed_kernel_time_pct or 0.0) - high
    assert (f"attribution: {high:.1f}% of kernel time by correlation id (high confidence), {medium:.1f}% by the NVTX "
            "range enclosing the launch or Inductor's provenance (medium)") in done.stdout.splitlines()


def test_module_coverage_is_stated_and_warned_below_95_pct(profiles, raw_sqlite, raw_kineto):
    """The share of kernel time with a module path, from each run's raw kernel durations; a training step's
    backward kernels take their forward op's, so its coverage is above 95 % too."""
    for run, profile in profiles.items():
        durations = raw_durations(run, raw_sqlite, raw_kineto)
        if not durations:
            continue
        total = sum(durations.values())
        with_module = sum(durations[k.correlation_id] for op in profile.operators if op.module_path
                          for k in op.kernels if k.correlation_id in durations)
        pct = profile.window.module_path_kernel_time_pct
        assert pct == pytest.approx(100.0 * with_module / total, abs=0.01), run
        warned = any(w.startswith("module paths cover") for w in profile.warnings)
        assert warned == (pct < 95.0), run
    assert profiles["conv_block_eager_train_torch"].window.module_path_kernel_time_pct > 95.0
    assert profiles["conv_block_eager"].window.module_path_kernel_time_pct == pytest.approx(100.0)
    assert all(p.schema_version == SCHEMA_VERSION for p in profiles.values())
