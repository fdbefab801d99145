"""Kineto trace → window kernels joined to their operators, on torch.profiler traces recorded on an H200.

Every expectation is recomputed from the raw chrome trace (json with exact decimals, tests/fixtures_util.py):
kernels are the `cat == "kernel"` events, their launch is the runtime/driver event of the same correlation id,
and the operator torch.profiler itself linked to a launch is the `cpu_op` of the kernel's External id.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fixtures_util import TORCH_RUNS, RawTrace, enclosing, is_op_name, ns, raw_trace, run_dir

from mcp_server.backends.registry import assemble
from mcp_server.rundir import RunDir
from mcp_server.schema.profile import AttributionMethod, Confidence
from plugins.torch_profiler.reader import KinetoCapture, read_kineto_trace

EAGER = ["conv_block_eager_torch", "gpt2_eager_torch", "conv_block_eager_train_torch", "gpt2_eager_full_torch"]
INDUCTOR = ["conv_block_inductor_torch", "gpt2_inductor_torch"]
# Kernel events per trace (all launched inside the measure range), and Triton kernels among them.
KERNELS = {
    "conv_block_eager_torch": 23, "conv_block_inductor_torch": 23, "gpt2_eager_torch": 59,
    "gpt2_inductor_torch": 34, "conv_block_eager_train_torch": 84, "gpt2_eager_full_torch": 233,
}
TRITON = {"conv_block_inductor_torch": 16, "gpt2_inductor_torch": 17}
# Eager kernels launched outside every module range: gpt2's token + position embedding add (the root module's
# forward has no hook range); the train step's loss (pow, mean, ones_like after the forward) and its backward.
WITHOUT_MODULE = {
    "conv_block_eager_torch": [], "gpt2_eager_torch": [2], "gpt2_eager_full_torch": [2],
    "conv_block_eager_train_torch": list(range(23, 84)),
}


@pytest.fixture(scope="session")
def traces(tmp_path_factory) -> dict[str, Path]:
    """run -> path of its recorded kineto_trace.json."""
    return {r: run_dir(r, tmp_path_factory) / "torch" / "kineto_trace.json" for r in TORCH_RUNS}


@pytest.fixture(scope="session")
def raws(traces) -> dict[str, RawTrace]:
    """run -> the trace parsed with exact decimals."""
    return {r: raw_trace(p) for r, p in traces.items()}


@pytest.fixture(scope="session")
def captures(traces) -> dict[str, KinetoCapture]:
    """run -> KinetoCapture read by the adapter."""
    return {r: read_kineto_trace(p) for r, p in traces.items()}


@pytest.mark.parametrize("run", TORCH_RUNS)
def test_every_kernel_event_is_read_none_dropped(raws, captures, run):
    raw, capture = raws[run], captures[run]
    events = raw.of("kernel")
    assert len(events) == KERNELS[run] == len(capture.kernels)
    assert Counter(k.correlation_id for k in capture.kernels) == Counter(int(e["args"]["correlation"]) for e in events)
    measure, launches = raw.measure(), raw.launches
    for e in events:  # the trace holds the window only: every kernel was launched inside the measure range
        launch = launches[int(e["args"]["correlation"])]
        assert measure["ts"] <= launch["ts"] <= measure["ts"] + measure["dur"]
    assert capture.warnings == []
    assert (capture.memcpy_count, capture.memset_count) == (len(raw.of("gpu_memcpy")), len(raw.of("gpu_memset")))


@pytest.mark.parametrize("run", TORCH_RUNS)
def test_ordinals_follow_launch_order(raws, captures, run):
    ordered = raws[run].kernels_in_launch_order()
    kernels = captures[run].kernels
    assert [k.ordinal for k in kernels] == list(range(len(kernels)))
    assert [k.correlation_id for k in kernels] == [int(e["args"]["correlation"]) for e in ordered]
    launches = [k.launch_start_ns for k in kernels]
    assert launches == sorted(launches)


@pytest.mark.parametrize("run", TORCH_RUNS)
def test_durations_and_launch_geometry_are_the_traces(raws, captures, run):
    for kernel, event in zip(captures[run].kernels, raws[run].kernels_in_launch_order(), strict=True):
        args = event["args"]
        assert kernel.name == event["name"]
        assert kernel.duration_ns == ns(event["dur"])
        assert (kernel.grid, kernel.block) == (tuple(args["grid"]), tuple(args["block"]))
        assert (kernel.device_id, kernel.stream_id) == (args["device"], args["stream"])
        assert (kernel.registers_per_thread, kernel.shared_memory_bytes) == (
            args["registers per thread"], args["shared memory"]
        )


def test_timestamps_are_exact_nanoseconds(raws, captures):
    wrong = {}
    for run in TORCH_RUNS:
        measure = raws[run].measure()
        capture = captures[run]
        starts = [ns(e["ts"]) for e in raws[run].kernels_in_launch_order()]
        off = sum(1 for k, s in zip(capture.kernels, starts, strict=True) if k.start_ns != s)
        off += capture.window_start_ns != ns(measure["ts"])
        off += capture.window_end_ns != ns(measure["ts"] + measure["dur"])
        if off:
            wrong[run] = off
    assert wrong == {}


@pytest.mark.parametrize("run", TORCH_RUNS)
def test_linked_op_is_the_cpu_op_of_the_kernels_external_id(raws, captures, run):
    ops = raws[run].ops_by_external_id
    for kernel, event in zip(captures[run].kernels, raws[run].kernels_in_launch_order(), strict=True):
        assert kernel.linked_op == ops[int(event["args"]["External id"])]["name"]


@pytest.mark.parametrize("run", EAGER + INDUCTOR)
def test_innermost_frame_is_the_linked_op(raws, captures, run):
    """The innermost operator enclosing each launch is the one torch.profiler linked (eager: an aten op; Inductor:
    the extern aten op, or the Triton kernel's own launch range)."""
    raw = raws[run]
    ops, launches, cpu_ops = raw.ops_by_external_id, raw.launches, raw.of("cpu_op")
    for kernel, event in zip(captures[run].kernels, raw.kernels_in_launch_order(), strict=True):
        linked = ops[int(event["args"]["External id"])]
        launch = launches[int(event["args"]["correlation"])]
        # In the raw trace itself, the linked op is the innermost cpu_op around the launch on its thread.
        assert enclosing(cpu_ops, launch["tid"], launch["ts"])[-1] is linked
        if is_op_name(linked["name"]):
            innermost = [f for f in kernel.stack if f.kind == "op"][-1]
        else:
            assert run in INDUCTOR and linked["name"] == kernel.name
            innermost = kernel.stack[-1]
        assert innermost.name == linked["name"]
        # Same event: 1 ns of slack for the float conversion (test_timestamps_are_exact_nanoseconds).
        assert abs(innermost.start_ns - ns(linked["ts"])) <= 1
        assert kernel.launch_thread == launch["tid"]


@pytest.mark.parametrize("run", EAGER)
def test_eager_module_paths(raws, captures, run):
    """Each kernel's innermost module frame is the innermost `module:` range around its launch."""
    raw = raws[run]
    launches, annotations = raw.launches, raw.of("user_annotation")
    without = []
    for kernel, event in zip(captures[run].kernels, raw.kernels_in_launch_order(), strict=True):
        launch = launches[int(event["args"]["correlation"])]
        modules = [e["name"].removeprefix("module:") for e in enclosing(annotations, launch["tid"], launch["ts"])
                   if e["name"].startswith("module:")]
        assert [f.name for f in kernel.stack if f.kind == "module"] == modules
        if not modules:
            without.append(kernel.ordinal)
    assert without == WITHOUT_MODULE[run]


@pytest.mark.parametrize("run", INDUCTOR)
def test_triton_kernels_are_linked_to_their_launch_annotation(captures, run):
    kernels = captures[run].kernels
    triton = [k for k in kernels if k.name.startswith("triton_")]
    assert len(triton) == TRITON[run]
    for k in kernels:
        names = [f.name for f in k.stack]
        assert names[0] == "operator_profiler::measure" and names[2].startswith("## Call CompiledFxGraph ")
        if k in triton:
            assert k.linked_op == k.name
            assert (k.stack[-1].kind, k.stack[-1].name) == ("annotation", k.name)
            assert not any(f.kind == "op" for f in k.stack)
        else:
            assert k.stack[-1].kind == "op" and k.linked_op == k.stack[-1].name


def test_train_step_has_backward_ops_on_the_autograd_thread(raws, captures, tmp_path_factory):
    run = "conv_block_eager_train_torch"
    raw, kernels = raws[run], captures[run].kernels
    main = raw.measure()["tid"]
    backward = [k for k in kernels if k.launch_thread != main]
    assert (len(kernels) - len(backward), len(backward)) == (26, 58)
    assert {k.launch_thread for k in backward} == {
        launch["tid"] for launch in raw.launches.values() if launch["tid"] != main
    }
    for k in backward:
        assert k.stack[0].name.startswith("autograd::engine::evaluate_function: ")
        assert any(f.kind == "op" for f in k.stack)
    backward_ops = {[f.name for f in k.stack if f.kind == "op"][-1] for k in backward}
    assert {
        "aten::convolution_backward", "aten::native_batch_norm_backward", "aten::threshold_backward",
        "aten::max_pool2d_with_indices_backward", "aten::mm",
    } <= backward_ops

    profile = assemble(RunDir(run_dir(run, tmp_path_factory)))
    assert profile.unattributed_kernels == []
    assert profile.window.kernel_count == 84 and profile.window.attributed_kernel_time_pct == 100.0
    attributions = {(k.attribution.method, k.attribution.confidence) for op in profile.operators for k in op.kernels}
    assert attributions == {(AttributionMethod.KINETO_CORRELATION, Confidence.HIGH)}
    names = Counter(op.operator_name for op in profile.operators)
    assert names["aten::convolution_backward"] == names["aten::conv2d"] == 6
