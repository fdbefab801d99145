"""Classify NVTX push/pop range names into `Frame`s: operator, module or annotation.

The harness and PyTorch write three kinds of range names (seen in the nsys and ncu captures of torch 2.11):

- `module:features.0.conv` — the harness's forward hook per `nn.Module` (eager mode); `node:blocks.0.attention`
  around an operator an FX GraphModule's code calls, the module its node came from (a module to attribution);
- `aten::addmm, seq = 3, op_id = 40, sizes = [[10], [2, 32], [32, 10], [], []], input_op_ids = [...]` —
  `torch.autograd.profiler.emit_nvtx(record_shapes=True)`; `seq` appears only when autograd records a
  sequence number, `sizes` only with record_shapes, one list per input (`[]` for scalars and non-tensors);
- everything else: `operator_profiler::measure` (the measured window), `Torch-Compiled Region: 0/0, op_id = 2`,
  `## Call CompiledFxGraph <hash> ##, op_id = 5`, and Triton launches under torch.compile,
  `triton_poi_fused_convolution_0, op_id = 6, sizes = [...]`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol, TypeVar

from mcp_server.children.contract import MODULE_RANGE_PREFIX, NODE_RANGE_PREFIX, SITE_RANGE_PREFIX, UPDATE_RANGE
from mcp_server.schema.records import Frame

MODULE_PREFIX = MODULE_RANGE_PREFIX
GRAPH_CALL_PREFIX = "## Call CompiledFxGraph"  # Inductor's range around one call of a compiled graph
SITE_PREFIX = SITE_RANGE_PREFIX
# torch.optim's own profiler ranges, and the harness's around a hand-written loop's update (`--window-fn backward`)
STEP_PREFIX = "Optimizer.step#"
OPTIMIZER_PREFIXES = (STEP_PREFIX, "Optimizer.zero_grad#", UPDATE_RANGE)


class KindedFrame(Protocol):
    """A classified range: `Frame`, or the nsys reader's light `NvtxRange`."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str | None: ...


Kinded = TypeVar("Kinded", bound=KindedFrame)


def operator_frames(stack: Sequence[Kinded]) -> list[Kinded]:
    """The operator ranges of a stack (outermost first) that make its operator call: those inside the innermost
    optimizer range, else all. An optimizer stepped from a hook that an operator runs (a leaf's post-accumulate-grad
    hook, inside autograd's `AccumulateGrad`) makes calls of its own, not more of that operator's."""
    start = 0
    for position, frame in enumerate(stack):
        if frame.name.startswith(OPTIMIZER_PREFIXES):
            start = position + 1
    return [f for f in stack[start:] if f.kind == "op"]
FIELD_SEPARATOR = ", "
SIZES_FIELD = "sizes = "
# Namespaces whose `ns::name` ranges are markers, not PyTorch operators (FSDP's record functions mark stages of
# its hooks; its collectives and copies run under them as real operators).
ANNOTATION_NAMESPACES = frozenset({"operator_profiler", "FSDP"})
# FSDP2's range around one unit's stage, `FSDP::all_gather (layers.3)`, `FSDP::post_backward_reduce (layers.3)`:
# the work under it moves the parameters or gradients of the module at that path (no path: the root unit).
FSDP_UNIT = re.compile(r"^FSDP::[a-z_]+ \((?P<fqn>[^()]+)\)$")

_OP_HEAD = re.compile(r"^(?P<ns>[A-Za-z_]\w*)::\S+$")
# A process-group backend's record function around one collective's transfer (`gloo:all_reduce`,
# `nccl:all_reduce`): the work of that collective, an operator like c10d's call that encloses it.
_COLLECTIVE_HEAD = re.compile(r"^(?:gloo|nccl):_?[a-z_]+$")
# `sizes = [[2, 3], [], [8]]`: one flat list of dims per input.
_SIZES = re.compile(re.escape(FIELD_SEPARATOR + SIZES_FIELD) + r"(\[(?:\[[^\[\]]*\](?:, )?)*\])")


def range_name(text: str) -> str:
    """The name part of a range text: everything before the first `, ` (the `op_id = ...` fields dropped)."""
    return text.split(FIELD_SEPARATOR, 1)[0]


_SEQ = re.compile(r", seq = (\d+)")


def parse_seq(text: str) -> int | None:
    """The autograd sequence number of an emit_nvtx range (`aten::addmm, seq = 57, ...`), or None."""
    match = _SEQ.search(text)
    return int(match.group(1)) if match else None


@lru_cache(maxsize=65536)
def _kind(head: str) -> str:
    if FSDP_UNIT.match(head):
        return "module"
    if head.startswith(MODULE_PREFIX):
        return "module"
    if head.startswith(SITE_PREFIX):
        return "site"
    match = _OP_HEAD.match(head)
    if match:
        return "op" if match.group("ns") not in ANNOTATION_NAMESPACES else "annotation"
    return "op" if _COLLECTIVE_HEAD.match(head) else "annotation"


def fsdp_unit(head: str) -> str | None:
    """The module path an FSDP2 unit range names (`FSDP::all_gather (layers.3)` -> `layers.3`), or None."""
    match = FSDP_UNIT.match(head)
    return match.group("fqn") if match else None


def is_operator(head: str) -> bool:
    """True for a PyTorch operator name like `aten::addmm` (a namespace, `::`, no spaces; not a marker)."""
    return _kind(head) == "op"


@lru_cache(maxsize=65536)
def _shapes(field: str) -> tuple[tuple[int, ...] | None, ...] | None:
    try:
        value = json.loads(field)
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    return tuple(
        tuple(dims) if isinstance(dims, list) and all(type(d) is int for d in dims) else None for dims in value
    )


def parse_sizes(text: str) -> list[list[int] | None] | None:
    """The `sizes = [[...], ...]` field of an emit_nvtx range: one dims list per input, None where unparseable.

    Returns None when the text has no sizes field or it is not a well-formed list of dims lists.
    """
    match = _SIZES.search(text)
    if match is None:
        return None
    shapes = _shapes(match.group(1))
    return None if shapes is None else [None if dims is None else list(dims) for dims in shapes]


# the harness's own range prefixes, and the kind of frame each names
HARNESS_KINDS = {MODULE_RANGE_PREFIX: "module", NODE_RANGE_PREFIX: "module", SITE_RANGE_PREFIX: "site"}
HARNESS_PREFIXES = tuple(HARNESS_KINDS)


def harness_range(text: str) -> tuple[str, str] | None:
    """(name, kind) of a range the harness opened (`module:`, `node:` or `site:` and what it names), None for any
    other text: read alike from NVTX (nsys) and from the torch profiler's record functions."""
    for prefix, kind in HARNESS_KINDS.items():
        if text.startswith(prefix):
            return sys.intern(text[len(prefix):]), kind
    return None


def classify_text(text: str) -> tuple[str, str]:
    """(name, kind) of a range text, without building a frame: the classification every reader of NVTX ranges
    makes (`parse_range`, the nsys reader's light ranges, its sequence sweep). Names are interned: a million
    ranges share a few hundred of them."""
    harness = harness_range(text)
    if harness is not None:
        return harness
    name = sys.intern(range_name(text))
    kind = _kind(name)
    return (sys.intern(fsdp_unit(name) or name), kind) if kind == "module" else (name, kind)


def parse_range(text: str, start_ns: int | None = None, end_ns: int | None = None) -> Frame:
    """Classify one NVTX range name.

    `module:<path>` and `node:<path>` give kind 'module' named by the path; a namespaced PyTorch operator
    (`aten::addmm, ...`) gives kind 'op' with the bare operator name and `input_shapes` from its `sizes` field; else,
    including `operator_profiler::measure`, gives kind 'annotation' named by the text before the first `, `
    (for a Triton launch range, the kernel name; its `sizes` are kept as `input_shapes` too).
    """
    name, kind = classify_text(text)
    ranged = kind not in ("module", "site")  # operator and annotation ranges carry emit_nvtx's fields
    shapes = parse_sizes(text) if ranged and FIELD_SEPARATOR in text else None
    seq = parse_seq(text) if ranged else None
    return Frame(name=name, kind=kind, input_shapes=shapes, start_ns=start_ns, end_ns=end_ns, seq=seq)
