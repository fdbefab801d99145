"""Replace hand-written attention by `scaled_dot_product_attention` (FX pass, IR level: functional).

Matches `softmax(q @ k.transpose(-2, -1) * scale [+ mask], dim=-1) [-> dropout(training=False)] @ v`, the
scale written as `* c`, `/ c` or absent, and rewrites it as
`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=...)`, which dispatches to a fused
flash / memory-efficient / cuDNN kernel on a GPU and never materialises the L×L score matrix in DRAM.

When to apply: attention written out by hand (GPT-2 style blocks, older model code) in inference.

Trigger metrics (profile.json): in an attention module, `aten::matmul`/`aten::bmm` pairs around
`aten::softmax` (plus `aten::div`/`aten::mul`, `aten::masked_fill`/`aten::add`) holding a large share of
the block's time; the softmax kernels memory-bound (`dram_throughput_pct` high, arithmetic intensity < 1);
DRAM bytes of the softmax ≈ batch × heads × L² × element size; no `flash`/`fmha`/`efficient_attention`
kernel in the window.

Expected gain: the score matrix's round trips to DRAM go away: attention time falls by roughly the
softmax/scale/mask kernels' share plus part of the two GEMMs, growing with sequence length (2-4× on the
attention block at L ≥ 512 is common; small at L ≤ 64). Causal masks written as `masked_fill` with a
boolean triangle are not matched: pass `is_causal=True` by hand.
Self-contained (torch only): copy it into an optimized workload.
"""

from __future__ import annotations

import numbers
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

MATMUL_TARGETS = (operator.matmul, torch.matmul, torch.bmm)
SOFTMAX_TARGETS = (torch.softmax, F.softmax)


def _call(node: Any, targets: tuple[Any, ...]) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _ndim(node: Any) -> int | None:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None


def _key_of_transpose(node: Any) -> fx.Node | None:
    """k when `node` is k.transpose(-2, -1) (method or function, any spelling of the last two dims)."""
    if not isinstance(node, fx.Node) or len(node.users) != 1:
        return None
    if (node.op == "call_method" and node.target == "transpose") or _call(node, (torch.transpose,)):
        source, *dims = node.args
        ndim = _ndim(source)
        last_two = {ndim - 2, ndim - 1} if ndim is not None else set()
        normal = {d if d >= 0 or ndim is None else d + ndim for d in dims if isinstance(d, int)}
        if len(dims) == 2 and (normal == {-2, -1} or (last_two and normal == last_two)):
            return source
    return None


def _softmax_input(node: fx.Node) -> Any:
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    if dim not in (-1, (_ndim(node) or 0) - 1) or node.kwargs.get("dtype") is not None:
        return None
    return node.args[0]


def _probabilities(node: Any) -> fx.Node | None:
    """The softmax node, looking through an inference dropout."""
    if _call(node, (F.dropout,)):
        training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
        p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
        if (training is not False and p != 0) or len(node.users) != 1:
            return None
        node = node.args[0]
    is_method = isinstance(node, fx.Node) and node.op == "call_method" and node.target == "softmax"
    return node if (_call(node, SOFTMAX_TARGETS) or is_method) and len(node.users) == 1 else None


def _unscale(node: Any) -> tuple[Any, float | None, Any]:
    """(scores before scaling, scale or None, additive mask or None) of the softmax input."""
    mask = None
    if _call(node, (operator.add, torch.add)) and len(node.users) == 1 and len(node.args) == 2:
        node, mask = node.args
    if _call(node, (operator.truediv, torch.div)) and isinstance(node.args[1], numbers.Real) and len(node.users) == 1:
        return node.args[0], 1.0 / float(node.args[1]), mask
    if _call(node, (operator.mul, torch.mul)) and len(node.users) == 1:
        left, right = node.args
        if isinstance(right, numbers.Real):
            return left, float(right), mask
        if isinstance(left, numbers.Real):
            return right, float(left), mask
    return node, None, mask


def substitute_sdpa(gm: fx.GraphModule) -> int:
    """Rewrite each matched attention as one `scaled_dot_product_attention` call; return how many."""
    graph = gm.graph
    count = 0
    for out in list(graph.nodes):
        if not _call(out, MATMUL_TARGETS):
            continue
        probs_node, value = out.args
        softmax = _probabilities(probs_node)
        if softmax is None:
            continue
        scores, scale, mask = _unscale(_softmax_input(softmax))
        if not _call(scores, MATMUL_TARGETS) or len(scores.users) != 1:
            continue
        query, key_t = scores.args
        key = _key_of_transpose(key_t)
        if key is None or isinstance(mask, numbers.Real):
            continue
        head_dim = query.meta["example_value"].shape[-1] if "example_value" in query.meta else None
        kwargs: dict[str, Any] = {"attn_mask": mask, "scale": 1.0 if scale is None else scale}
        if scale is not None and head_dim and abs(scale * float(head_dim) ** 0.5 - 1.0) < 1e-6:
            kwargs["scale"] = None  # the default 1/sqrt(E): let SDPA pick it
        with graph.inserting_before(out):
            fused = graph.call_function(F.scaled_dot_product_attention, (query, key, value), kwargs)
        fused.meta.update(out.meta)
        out.replace_all_uses_with(fused)
        graph.eliminate_dead_code()
        count += 1
    if count:
        graph.lint()
        gm.recompile()
    return count
