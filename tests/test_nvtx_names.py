"""NVTX range names → frames, on range texts copied from the recorded H200 captures (torch 2.11)."""

from __future__ import annotations

import sqlite3

import pytest
from fixtures_util import NSYS_RUNS, run_dir

from mcp_server.children.contract import MEASURE_RANGE
from plugins.nvtx_names import is_operator, parse_range, parse_sizes, range_name

# Copied verbatim from the fixtures' nsys NVTX_EVENTS (ncu's nvtx_state() holds the same strings).
CONV2D = (
    "aten::conv2d, op_id = 1, sizes = [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], []], input_op_ids = "
    "[(0,-1), (0,-1), (0,-1), (0,-1), (0,-1), (0,-1), (0,-1)]"
)
ADDMM = (
    "aten::addmm, op_id = 105, sizes = [[10], [2, 32], [32, 10], [], []], input_op_ids = "
    "[(0,-1), (99,0), (102,0), (0,-1), (0,-1)]"
)
EMPTY = (
    "aten::empty, op_id = 9, sizes = [[], [], [], [], [], []], input_op_ids = "
    "[(0,-1), (0,-1), (0,-1), (0,-1), (0,-1), (0,-1)]"
)
TRITON = (
    "triton_poi_fused_convolution_0, op_id = 6, sizes = [[2, 3, 32, 32], [2, 3, 32, 32], [], []], "
    "input_op_ids = [(0,-1), (0,-1), (0,-1), (0,-1)]"
)
TRITON_PER = (
    "triton_per_fused__softmax_bitwise_not_exp_masked_fill_mul_prepare_softmax_online_slice_sub_view_3, op_id = 11, "
    "sizes = [[2, 2, 16, 16], [1, 1, 64, 64], [], []], input_op_ids = [(0,-1), (0,-1), (0,-1), (0,-1)]"
)
COMPILED_FX = "## Call CompiledFxGraph flreczkgjow5isz5bpq5bkotmzsykwemmug7ltv34lveappmn3au ##, op_id = 5"
# torch's emit_nvtx format when autograd records a sequence number (training); the nsys fixtures are inference runs.
LINEAR_SEQ = (
    "aten::linear, seq = 12, op_id = 34, sizes = [[4, 128, 768], [2304, 768], [2304]], "
    "input_op_ids = [(33,0), (0,-1), (0,-1)]"
)


COPIED = {
    "CONV2D": CONV2D, "ADDMM": ADDMM, "EMPTY": EMPTY, "TRITON": TRITON, "TRITON_PER": TRITON_PER,
    "COMPILED_FX": COMPILED_FX, "AOT": "AOTDispatcher Runtime Wrapper Prologue, op_id = 4",
    "DYNAMO": "TorchDynamo Cache Lookup, op_id = 1", "REGION": "Torch-Compiled Region: 0/0, op_id = 2",
    "MODULE": "module:features.0.conv", "MEASURE": MEASURE_RANGE,
}


def test_copied_texts_are_in_the_recorded_captures(tmp_path_factory):
    """Every text above said to be copied from the fixtures occurs verbatim among their NVTX ranges."""
    texts: set[str] = set()
    for run in NSYS_RUNS:
        db = run_dir(run, tmp_path_factory) / "nsys" / "report.sqlite"
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute(
                "SELECT COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId"
            )
            texts.update(row[0] for row in rows)
    assert [name for name, text in COPIED.items() if text not in texts] == []
    assert LINEAR_SEQ not in texts  # the training format is torch's, not recorded here


def test_module_range():
    frame = parse_range("module:features.0.conv", 16747341, 17201189)
    assert (frame.kind, frame.name, frame.input_shapes) == ("module", "features.0.conv", None)
    assert (frame.start_ns, frame.end_ns) == (16747341, 17201189)
    assert parse_range("module:h.0.attn.c_attn").name == "h.0.attn.c_attn"
    assert parse_range("module:wte").name == "wte"


@pytest.mark.parametrize(
    ("text", "name", "shapes"),
    [
        (CONV2D, "aten::conv2d", [[2, 3, 32, 32], [8, 3, 3, 3], [], [], [], [], []]),
        (ADDMM, "aten::addmm", [[10], [2, 32], [32, 10], [], []]),
        (EMPTY, "aten::empty", [[], [], [], [], [], []]),
        (LINEAR_SEQ, "aten::linear", [[4, 128, 768], [2304, 768], [2304]]),
        ("aten::addmm, seq = 3, op_id = 7", "aten::addmm", None),  # record_shapes off: no sizes field
        ("aten::mm", "aten::mm", None),
        ("aten::mm, op_id = 7, sizes = [[32, 64], [64", "aten::mm", None),  # truncated: shapes unknown
        ("aten::view, op_id = 12, sizes = [[8], []], input_op_ids = [(0,-1), (0,-1)]", "aten::view", [[8], []]),
    ],
)
def test_operator_range(text, name, shapes):
    frame = parse_range(text, 1, 2)
    assert (frame.kind, frame.name, frame.input_shapes) == ("op", name, shapes)
    assert (frame.start_ns, frame.end_ns) == (1, 2)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        (MEASURE_RANGE, "operator_profiler::measure"),
        ("Torch-Compiled Region: 0/0, op_id = 2", "Torch-Compiled Region: 0/0"),
        (COMPILED_FX, "## Call CompiledFxGraph flreczkgjow5isz5bpq5bkotmzsykwemmug7ltv34lveappmn3au ##"),
        ("TorchDynamo Cache Lookup, op_id = 1", "TorchDynamo Cache Lookup"),
        ("AOTDispatcher Runtime Wrapper Prologue, op_id = 4", "AOTDispatcher Runtime Wrapper Prologue"),
        (TRITON, "triton_poi_fused_convolution_0"),
        (TRITON_PER, TRITON_PER.split(", ")[0]),
        ("autograd::engine::evaluate_function: AddmmBackward0", "autograd::engine::evaluate_function: AddmmBackward0"),
    ],
)
def test_annotation_range(text, name):
    frame = parse_range(text)
    assert (frame.kind, frame.name) == ("annotation", name)


def test_triton_range_keeps_its_argument_shapes():
    assert parse_range(TRITON).input_shapes == [[2, 3, 32, 32], [2, 3, 32, 32], [], []]
    assert parse_range(COMPILED_FX).input_shapes is None


def test_helpers():
    assert range_name(ADDMM) == "aten::addmm"
    assert range_name(MEASURE_RANGE) == MEASURE_RANGE
    assert is_operator("aten::addmm") and is_operator("prims::convert_element_type")
    assert not is_operator(MEASURE_RANGE) and not is_operator("Torch-Compiled Region: 0/0")
    assert parse_sizes("aten::mm, op_id = 7") is None
    assert parse_sizes("aten::mm, op_id = 7, sizes = [], input_op_ids = []") == []


def test_parsed_shapes_are_not_shared_between_frames():
    first, second = parse_range(ADDMM), parse_range(ADDMM)
    first.input_shapes[0].append(99)
    assert second.input_shapes[0] == [10]
