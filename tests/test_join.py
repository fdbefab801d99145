"""The nsys/Kineto ↔ ncu join and the attribution ladder, on small inline kernels and counter records."""

from __future__ import annotations

import pytest

from mcp_server.assemble.attribute import attribute_kernels
from mcp_server.assemble.join import join_counters, launch_position
from mcp_server.assemble.provenance import ExternCall, KernelOrigin, Provenance
from mcp_server.schema.profile import AttributionMethod, Confidence, Metric
from mcp_server.schema.records import CounterRecord, Frame, TraceKernel

G1, G2 = (4, 1, 1), (8, 1, 1)
B1, B2 = (128, 1, 1), (256, 1, 1)
MEASURE = Frame(name="operator_profiler::measure", kind="annotation", start_ns=0, end_ns=10_000)


def kernel(ordinal: int, name: str, grid: tuple[int, int, int] = G1, block: tuple[int, int, int] = B1,
           mangled: str | None = None, stack: list[Frame] | None = None, linked: str | None = None,
           stream: int | None = None) -> TraceKernel:
    """A timeline kernel launched at 1000 + 100 * ordinal, running 10 ns."""
    return TraceKernel(
        ordinal=ordinal, name=name, mangled_name=mangled, start_ns=1000 + 100 * ordinal, duration_ns=10,
        stream_id=stream,
        grid=grid, block=block, launch_thread=7, launch_start_ns=990 + 100 * ordinal,
        stack=stack if stack is not None else [MEASURE], linked_op=linked,
    )


def record(ordinal: int, name: str, value: float, grid: tuple[int, int, int] = G1, block: tuple[int, int, int] = B1,
           mangled: str | None = None, stream: int | None = None) -> CounterRecord:
    """An ncu record whose `duration` counter carries `value`, to tell records apart."""
    return CounterRecord(
        ordinal=ordinal, name=name, mangled_name=mangled, grid=grid, block=block, stream=stream,
        metrics={"duration": Metric(value=value, unit="ns")},
    )


def values(joined: dict[int, tuple[dict[str, Metric], int | None]]) -> dict[int, tuple[float, int | None]]:
    """launch -> (duration counter, propagated_from)."""
    return {o: (metrics["duration"].value, source) for o, (metrics, source, _) in joined.items()}


# ---------------------------------------------------------------------------------------------------------------
# join_counters


@pytest.mark.parametrize("deduplicated", [False, True])
def test_in_order_join_is_exact(deduplicated):
    kernels = [kernel(0, "A"), kernel(1, "B"), kernel(2, "C")]
    records = [record(0, "A", 1.0), record(1, "B", 2.0), record(2, "C", 3.0)]
    joined, problems, _ = join_counters(kernels, records, deduplicated)
    assert values(joined) == {0: (1.0, None), 1: (2.0, None), 2: (3.0, None)}
    assert problems == []


def test_swapped_records_are_reported_and_the_launch_gets_no_counters():
    kernels = [kernel(0, "A"), kernel(1, "B")]
    joined, problems, _ = join_counters(kernels, [record(0, "B", 2.0), record(1, "A", 1.0)], deduplicated=False)
    assert values(joined) == {1: (2.0, None)}  # B's counters on B's launch; A's launch left without any
    assert len(problems) == 3
    assert "launch 0" in problems[0] and "'A'" in problems[0] and "'B'" in problems[0]
    assert "ncu record 1 ('A') matches no later window launch" in problems[1]
    assert "1 window launches have no ncu counters" in problems[2] and "launch 0" in problems[2]


def test_a_swap_in_a_longer_sequence_never_puts_counters_on_another_kernel():
    kernels = [kernel(i, name) for i, name in enumerate("ABCD")]
    records = [record(0, "A", 1.0), record(1, "C", 3.0), record(2, "B", 2.0), record(3, "D", 4.0)]
    joined, problems, _ = join_counters(kernels, records, deduplicated=False)
    assert values(joined) == {0: (1.0, None), 2: (3.0, None), 3: (4.0, None)}
    names = {r.metrics["duration"].value: r.name for r in records}
    assert all(names[metrics["duration"].value] == kernels[o].name for o, (metrics, _, _) in joined.items())
    assert any("launch 1" in p and "'B'" in p for p in problems)
    assert any("ncu record 2 ('B') matches no later window launch" in p for p in problems)
    assert any("have no ncu counters" in p and "launch 1" in p for p in problems)


def test_a_swap_of_configurations_seen_once_is_reported_under_deduplication():
    kernels = [kernel(0, "A"), kernel(1, "B"), kernel(2, "C")]
    records = [record(0, "A", 1.0), record(1, "C", 3.0), record(2, "B", 2.0)]
    joined, problems, _ = join_counters(kernels, records, deduplicated=True)
    assert values(joined) == {0: (1.0, None), 2: (3.0, None)}
    assert len(problems) == 3
    assert "launch 1: timeline ran 'B', ncu profiled 'C' next" in problems[0]
    assert "ncu record 2 ('B') matches no later window launch" in problems[1]
    assert "1 window launches have no ncu counters" in problems[2] and "launch 1" in problems[2]


def test_a_swap_is_reported_under_deduplication_when_the_skipped_configuration_recurs():
    kernels = [kernel(0, "A"), kernel(1, "B"), kernel(2, "C"), kernel(3, "B")]
    records = [record(0, "A", 1.0), record(1, "C", 3.0), record(2, "B", 2.0)]  # ncu: C before the first B
    _, problems, _ = join_counters(kernels, records, deduplicated=True)
    assert problems != []


def test_deduplicated_launches_take_the_nearest_earlier_replay_of_their_configuration():
    kernels = [
        kernel(0, "A"), kernel(1, "X"), kernel(2, "A"), kernel(3, "Y"), kernel(4, "A"), kernel(5, "A", grid=G2),
        kernel(6, "X"), kernel(7, "A", grid=G2),
    ]
    # ncu replayed launch 2 again (same configuration as launch 0): launch 4 must copy launch 2, not launch 0.
    records = [
        record(0, "A", 10.0), record(1, "X", 20.0), record(2, "A", 30.0), record(3, "Y", 40.0),
        record(4, "A", 50.0, grid=G2),
    ]
    joined, problems, _ = join_counters(kernels, records, deduplicated=True)
    assert values(joined) == {
        0: (10.0, None), 1: (20.0, None), 2: (30.0, None), 3: (40.0, None), 4: (30.0, 2), 5: (50.0, None),
        6: (20.0, 1), 7: (50.0, 5),
    }
    assert problems == []


def test_deduplication_never_crosses_configurations():
    kernels = [kernel(0, "A"), kernel(1, "A", block=B2)]
    joined, problems, _ = join_counters(kernels, [record(0, "A", 1.0)], deduplicated=True)
    assert values(joined) == {0: (1.0, None)}
    assert problems == ["1 window launches have no ncu counters (first: launch 1 'A')"]


def test_propagation_prefers_a_replay_of_the_same_input_shapes_and_names_any_other():
    def op(shapes):
        return [MEASURE, Frame(name="aten::convolution", kind="op", start_ns=0, end_ns=10_000, input_shapes=shapes)]

    s1, s2, s3 = [[2, 3, 32, 32]], [[2, 8, 32, 32]], [[2, 16, 32, 32]]
    kernels = [kernel(0, "conv", stack=op(s1)), kernel(1, "conv", stack=op(s2)), kernel(2, "conv", stack=op(s1)),
               kernel(3, "conv", stack=op(s3))]
    # ncu's key has no input shapes: it replayed launches 0 and 1 only because ours here differ in nothing it sees.
    records = [record(0, "conv", 10.0), record(1, "conv", 20.0)]
    joined, problems, notes = join_counters(kernels, records, deduplicated=True)
    assert values(joined) == {0: (10.0, None), 1: (20.0, None), 2: (10.0, 0), 3: (20.0, 1)}
    assert problems == []
    assert notes == [
        "1 launches carry the counters of a launch of their configuration with other input shapes (first: launch 3 "
        "'conv' from launch 1: [[2, 8, 32, 32]], not [[2, 16, 32, 32]]); --no-dedupe replays each launch"
    ]
    # The shape-variant pass replayed launch 3 itself: its own counters, and nothing left to note.
    start = launch_position(kernels, "^(conv)$", launch_skip=3)
    assert start == 3
    joined, problems, notes = join_counters(kernels, records, deduplicated=True, variants=[record(0, "conv", 30.0)],
                                            variants_start=start)
    assert values(joined) == {0: (10.0, None), 1: (20.0, None), 2: (10.0, 0), 3: (30.0, None)}
    assert (problems, notes) == ([], [])


def test_shared_memory_is_part_of_the_configuration():
    kernels = [kernel(0, "A"), kernel(1, "A")]
    kernels[1].shared_memory_bytes = 4096
    joined, problems, _ = join_counters(kernels, [record(0, "A", 1.0)], deduplicated=True)
    assert values(joined) == {0: (1.0, None)}
    assert problems == ["1 window launches have no ncu counters (first: launch 1 'A')"]


def test_filtered_subset_reports_no_false_mismatch():
    kernels = [kernel(i, name) for i, name in enumerate("ABCDE")]
    joined, problems, _ = join_counters(kernels, [record(0, "B", 2.0), record(1, "D", 4.0)], False, filtered=True)
    assert values(joined) == {1: (2.0, None), 3: (4.0, None)}
    assert problems == []


@pytest.mark.parametrize(("deduplicated", "filtered"), [(False, False), (True, False), (False, True)])
def test_a_record_that_matches_nothing_is_reported(deduplicated, filtered):
    kernels = [kernel(0, "A"), kernel(1, "B")]
    joined, problems, _ = join_counters(kernels, [record(0, "A", 1.0), record(1, "Z", 9.0)], deduplicated, filtered)
    assert values(joined) == {0: (1.0, None)}
    assert any("ncu record 1 ('Z') matches no later window launch" in p for p in problems)
    assert any("'B'" in p for p in problems) != filtered  # launch 1 unmatched: reported unless filtered


def test_kernel_identity_uses_mangled_names_when_both_have_one():
    kernels = [
        kernel(0, "void f<float>(float *)", mangled="_Z1fIfEvPT_"),
        kernel(1, "void f<float>(float *)", mangled="_Z1fIdEvPT_"),
        kernel(2, "void   g<int>(int *)"),
    ]
    records = [
        record(0, "f", 1.0, mangled="_Z1fIfEvPT_"),  # ncu's short name, same function: joined
        record(1, "void f<float>(float *)", 2.0, mangled="_Z1fIhEvPT_"),  # same text, another function: not
        record(2, "void g<int>(int *)", 3.0),  # no mangled name: demangled names, whitespace normalised
    ]
    joined, problems, _ = join_counters(kernels, records, deduplicated=False)
    assert values(joined) == {0: (1.0, None), 2: (3.0, None)}
    assert any("matches no later window launch" in p for p in problems)


def test_grid_and_block_must_agree():
    kernels = [kernel(0, "A", grid=G1), kernel(1, "A", grid=G2)]
    joined, problems, _ = join_counters(kernels, [record(0, "A", 2.0, grid=G2)], deduplicated=False)
    assert values(joined) == {1: (2.0, None)}
    assert any("launch 0" in p for p in problems)


# ---------------------------------------------------------------------------------------------------------------
# attribute_kernels


def frame(name: str, kind: str, start: int, end: int, shapes: list[list[int] | None] | None = None) -> Frame:
    return Frame(name=name, kind=kind, start_ns=start, end_ns=end, input_shapes=shapes)


CONV_STACK = [
    MEASURE,
    frame("features.0", "module", 5, 300),
    frame("features.0.conv", "module", 10, 200),
    frame("aten::conv2d", "op", 20, 190, [[2, 3, 8, 8], [8, 3, 3, 3]]),
    frame("aten::convolution", "op", 25, 185),
    frame("aten::cudnn_convolution", "op", 30, 180),
]
GRAPH = [
    MEASURE,
    frame("Torch-Compiled Region: 0/0", "annotation", 50, 9000),
    frame("## Call CompiledFxGraph abc ##", "annotation", 60, 8000),
]
FUSED = "triton_poi_fused_add_relu_0"
ORIGINS = Provenance(
    kernels={
        FUSED: KernelOrigin(
            kernel_name=FUSED, aten_ops=["aten::add", "aten::relu"], source_nodes=["add", "relu"],
            module_paths=["block.act", "block.add"],
        )
    }
)


def test_kineto_linked_op_is_high_confidence():
    conv = kernel(0, "sm80_conv", stack=CONV_STACK, linked="aten::cudnn_convolution")
    operators, unattributed = attribute_kernels([conv], Provenance(), window_start_ns=1000)
    assert unattributed == []
    (op,) = operators
    assert (op.operator_id, op.operator_name, op.call_index) == ("aten::conv2d#0", "aten::conv2d", 0)
    assert (op.module_path, op.is_fused, op.fused_operators) == ("features.0.conv", False, [])
    assert op.input_shapes == [[2, 3, 8, 8], [8, 3, 3, 3]]
    (k,) = op.kernels
    assert (k.attribution.method, k.attribution.confidence) == (AttributionMethod.KINETO_CORRELATION, Confidence.HIGH)
    assert k.attribution.launch_op == "aten::cudnn_convolution"
    assert (k.kernel_id, k.start_ns, k.duration_ns, k.module_path) == (0, 0, 10, "features.0.conv")


@pytest.mark.parametrize(("linked", "links"), [("aten::mm", True), ("aten::cudnn_convolution", False), (None, True)])
def test_nvtx_enclosure_alone_is_medium_confidence(linked, links):
    """An NVTX stack (nsys), or a Kineto link that is not the innermost op of the stack, gives medium confidence."""
    conv = kernel(0, "sm80_conv", stack=CONV_STACK, linked=linked)
    (op,), _ = attribute_kernels([conv], Provenance(), window_start_ns=1000, high_confidence_links=links)
    attribution = op.kernels[0].attribution
    assert (attribution.method, attribution.confidence) == (AttributionMethod.NVTX_ENCLOSURE, Confidence.MEDIUM)
    assert (op.operator_name, attribution.launch_op, op.module_path) == (
        "aten::conv2d", "aten::cudnn_convolution", "features.0.conv"
    )


@pytest.mark.parametrize("style", ["nsys", "kineto"])
def test_triton_kernel_with_provenance_is_a_fused_operator(style):
    """nsys: the kernel sits in its launch range; Kineto: torch.profiler also links it to that range."""
    launch = [*GRAPH, frame(FUSED, "annotation", 100, 150)]
    linked = FUSED if style == "kineto" else None
    kernels = [kernel(0, FUSED, stack=launch, linked=linked), kernel(1, FUSED, stack=launch, linked=linked)]
    operators, unattributed = attribute_kernels(kernels, ORIGINS, window_start_ns=1000)
    assert unattributed == []
    assert [op.operator_id for op in operators] == [f"{FUSED}#0", f"{FUSED}#1"]  # one call per launch
    for op in operators:
        assert (op.operator_name, op.is_fused, op.fused_operators) == (FUSED, True, ["aten::add", "aten::relu"])
        assert op.module_path == "block"
        attribution = op.kernels[0].attribution
        assert (attribution.method, attribution.confidence) == (
            AttributionMethod.INDUCTOR_PROVENANCE, Confidence.MEDIUM
        )
        assert "aten::add" in attribution.detail and "aten::relu" in attribution.detail


def test_triton_kernel_found_by_its_own_name_without_a_launch_range():
    (op,), _ = attribute_kernels([kernel(0, FUSED, stack=GRAPH)], ORIGINS, window_start_ns=1000)
    assert (op.operator_id, op.is_fused) == (f"{FUSED}#0", True)


def test_a_kernel_with_nothing_to_go_on_is_unattributed_and_kept():
    kernels = [
        kernel(0, "mystery_kernel", stack=[MEASURE]),
        kernel(1, "triton_poi_fused_x_9", stack=[*GRAPH, frame("triton_poi_fused_x_9", "annotation", 90, 95)]),
        kernel(2, "no_stack", stack=[]),
    ]
    operators, unattributed = attribute_kernels(kernels, ORIGINS, window_start_ns=1000)
    assert operators == []
    assert [k.kernel_id for k in unattributed] == [0, 1, 2]
    for k in unattributed:
        assert (k.attribution.method, k.attribution.confidence) == (AttributionMethod.UNATTRIBUTED, Confidence.NONE)
        assert k.duration_ns == 10


def test_operator_identity_counts_calls_of_a_name_in_window_order():
    """The outermost op is the operator (one call = one outermost range), the innermost is each kernel's launch_op."""
    mm = frame("aten::mm", "op", 120, 190)
    first_linear = [MEASURE, frame("fc1", "module", 90, 260), frame("aten::linear", "op", 100, 250)]
    relu = [MEASURE, frame("act", "module", 290, 360), frame("aten::relu", "op", 300, 350)]
    second_linear = [MEASURE, frame("fc2", "module", 390, 560), frame("aten::linear", "op", 400, 550)]
    kernels = [
        kernel(0, "gemm", stack=[*first_linear, frame("aten::matmul", "op", 110, 200), mm]),
        kernel(1, "bias", stack=[*first_linear, frame("aten::add_", "op", 210, 240)]),
        kernel(2, "relu", stack=[*relu]),
        kernel(3, "gemm2", stack=[*second_linear, frame("aten::addmm", "op", 410, 540)]),
        kernel(4, "div", stack=[MEASURE, frame("aten::div", "op", 600, 700), frame("aten::div", "op", 610, 690)]),
    ]
    operators, unattributed = attribute_kernels(kernels, Provenance(), window_start_ns=0, high_confidence_links=False)
    assert unattributed == []
    assert [(op.operator_id, op.call_index, op.module_path) for op in operators] == [
        ("aten::linear#0", 0, "fc1"), ("aten::relu#0", 0, "act"), ("aten::linear#1", 1, "fc2"),
        ("aten::div#0", 0, None),
    ]
    assert [[k.kernel_id for k in op.kernels] for op in operators] == [[0, 1], [2], [3], [4]]
    assert [[k.attribution.launch_op for k in op.kernels] for op in operators] == [
        ["aten::mm", "aten::add_"], ["aten::relu"], ["aten::addmm"], ["aten::div"],
    ]
    assert all(op.operator_id == f"{op.operator_name}#{op.call_index}" for op in operators)


def test_counters_and_propagation_reach_the_kernel_records():
    kernels = [kernel(0, "A", stack=CONV_STACK), kernel(1, "A", stack=CONV_STACK)]
    joined = {0: ({"duration": Metric(value=5.0, unit="ns")}, None, None),
              1: ({"duration": Metric(value=5.0, unit="ns")}, 0, "same_shapes")}
    (op,), _ = attribute_kernels(kernels, Provenance(), 1000, counters=lambda o: joined[o])
    assert [(k.metrics["duration"].value, k.metrics["duration"].unit, k.propagated_from, k.propagation)
            for k in op.kernels] == [(5.0, "ns", None, None), (5.0, "ns", 0, "same_shapes")]


def test_library_kernels_in_a_compiled_graph_take_their_fx_node_module():
    """Extern convolutions under a graph call have no module range: the generated call()'s order names them."""
    conv = [frame("aten::convolution", "op", 0, 0), frame("aten::cudnn_convolution", "op", 0, 0)]
    kernels = [
        kernel(0, FUSED, stack=[*GRAPH, frame(FUSED, "annotation", 100, 150)]),
        kernel(1, "conv_a", stack=[*GRAPH, *(f.model_copy(update={"start_ns": 200, "end_ns": 290}) for f in conv)]),
        kernel(2, "conv_b", stack=[*GRAPH, *(f.model_copy(update={"start_ns": 300, "end_ns": 390}) for f in conv)]),
    ]
    provenance = ORIGINS.model_copy(update={"extern_calls": [
        [ExternCall(operator_name="aten::mm", module_path="other.fc")],
        [
            ExternCall(operator_name="aten::convolution", module_path="features.0.conv"),
            ExternCall(operator_name="aten::addmm", module_path="classifier"),  # launched no kernel here
            ExternCall(operator_name="aten::convolution", module_path="features.1.conv"),
        ],
    ]})
    operators, _ = attribute_kernels(kernels, provenance, 0, high_confidence_links=False)
    assert [(op.operator_id, op.module_path) for op in operators] == [
        (f"{FUSED}#0", "block"), ("aten::convolution#0", "features.0.conv"), ("aten::convolution#1", "features.1.conv"),
    ]


def test_launches_of_two_host_threads_join_per_stream_when_their_order_differs_under_ncu():
    # Thread 1 launches A, B on stream 20; thread 2 launches C, D on stream 24. The timeline interleaved them
    # A C B D; under ncu (each launch blocks while it replays) they came C D A B.
    kernels = [kernel(0, "A", stream=20), kernel(1, "C", stream=24), kernel(2, "B", stream=20),
               kernel(3, "D", stream=24)]
    records = [record(0, "C", 3.0, stream=24), record(1, "D", 4.0, stream=24), record(2, "A", 1.0, stream=20),
               record(3, "B", 2.0, stream=20)]
    joined, problems, notes = join_counters(kernels, records, deduplicated=False)
    assert values(joined) == {0: (1.0, None), 1: (3.0, None), 2: (2.0, None), 3: (4.0, None)}
    assert problems == []
    assert any("joined per CUDA stream" in n for n in notes)


def test_a_real_mismatch_within_a_stream_is_still_reported_after_the_per_stream_join():
    kernels = [kernel(0, "A", stream=20), kernel(1, "C", stream=24), kernel(2, "B", stream=20)]
    records = [record(0, "C", 3.0, stream=24), record(1, "A", 1.0, stream=20), record(2, "X", 9.0, stream=20)]
    joined, problems, _ = join_counters(kernels, records, deduplicated=False)
    assert values(joined) == {0: (1.0, None), 1: (3.0, None)}
    assert any("stream 20" in p and "'X'" in p for p in problems)
    assert any("1 window launches have no ncu counters" in p and "launch 2" in p for p in problems)


def test_one_stream_keeps_the_launch_order_join_and_its_report():
    kernels = [kernel(0, "A", stream=7), kernel(1, "B", stream=7)]
    records = [record(0, "B", 2.0, stream=7), record(1, "A", 1.0, stream=7)]
    _, problems, notes = join_counters(kernels, records, deduplicated=False)
    assert problems and not any("per CUDA stream" in n for n in notes)


def test_many_passed_over_launches_make_one_problem_line():
    kernels = [kernel(i, "A") for i in range(5)] + [kernel(5, "B")]
    _, problems, _ = join_counters(kernels, [record(0, "B", 2.0)], deduplicated=False)
    assert problems[0].startswith("5 timeline launches were passed over; first: launch 0: timeline ran 'A'")
    assert len(problems) == 2 and "5 window launches have no ncu counters" in problems[1]


def test_a_record_matching_no_launch_passes_over_none():
    """An autotuned convolution ncu saw as another kernel than the timeline's (cuDNN's benchmark mode picks again in
    each process): that record matches nothing, and the launches its search scanned were not passed over (the next
    records still match them); only the autotuned launch is."""
    kernels = [kernel(0, "A"), kernel(1, "conv_x"), kernel(2, "B"), kernel(3, "C")]
    records = [record(0, "A", 1.0), record(1, "conv_y", 9.0), record(2, "B", 2.0), record(3, "C", 3.0)]
    joined, problems, _ = join_counters(kernels, records, deduplicated=True)
    assert values(joined) == {0: (1.0, None), 2: (2.0, None), 3: (3.0, None)}
    assert [p for p in problems if "timeline ran" in p] == ["launch 1: timeline ran 'conv_x', ncu profiled 'B' next"]
    assert any("ncu record 1 ('conv_y') matches no later window launch" in p for p in problems)
    assert any("1 window launches have no ncu counters (first: launch 1 'conv_x')" in p for p in problems)


def test_a_truncated_replay_notes_the_launches_it_did_not_reach():
    kernels = [kernel(0, "A"), kernel(1, "B"), kernel(2, "C"), kernel(3, "A")]
    joined, problems, notes = join_counters(kernels, [record(0, "A", 1.0)], deduplicated=True, truncated=True)
    assert values(joined) == {0: (1.0, None), 3: (1.0, 0)}
    assert problems == []
    assert notes == ["2 window launches have no ncu counters: ncu was stopped before it replayed them "
                     "(first: launch 1 'B')"]


@pytest.mark.parametrize(("ranged", "expected"), [("ConvNet", "features.0.conv"), ("features", "features")])
def test_library_kernels_of_a_model_compiled_whole_take_the_finer_module(ranged, expected):
    """A model compiled whole runs its call eagerly and its forward compiled: captured with module hooks, its library
    calls lie in the model's own range only, and the generated call()'s order names a finer module. A submodule's
    range (a region compiled inside it) is kept."""
    conv = [frame("aten::convolution", "op", 200, 290), frame("aten::cudnn_convolution", "op", 200, 290)]
    module = frame(f"module:{ranged}", "module", 55, 8500).model_copy(update={"name": ranged})
    kernels = [kernel(0, "conv_a", stack=[MEASURE, module, *GRAPH[1:], *conv])]
    provenance = ORIGINS.model_copy(update={"root_module": "ConvNet", "extern_calls": [
        [ExternCall(operator_name="aten::convolution", module_path="features.0.conv")]]})
    operators, _ = attribute_kernels(kernels, provenance, 0, high_confidence_links=False)
    assert [op.module_path for op in operators] == [expected]
