"""Replace hand-written attention by `scaled_dot_product_attention` (FX pass, IR level: functional).

Matches `softmax(q @ k.transpose(-2, -1) * scale [+ mask], dim=-1) [-> dropout(training=False)] @ v`, the
scale written as `* c`, `/ c` or absent, and rewrites it as
`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=...)`, which dispatches to a fused
flash / memory-efficient / cuDNN kernel on a GPU and never materialises the L×L score matrix in DRAM.
`substitute_sdpa_through_casts` also takes the softmax in float32 between casts
(`softmax(scores.float(), dim=-1).to(q.dtype)`, T5's and many Hugging Face models' spelling): SDPA's fused kernels
accumulate in float32 themselves, and it hands SDPA each additive mask with a contiguous last dimension (a strided last
dimension, a permuted bias, keeps every fused kernel out).

When to apply: attention written out by hand (GPT-2 style blocks, older model code) in inference.

Trigger metrics (profile.json): in an attention module, `aten::matmul`/`aten::bmm` pairs around
`aten::softmax` (plus `aten::div`/`aten::mul`, `aten::masked_fill`/`aten::add`) holding a large share of
the block's time; the softmax kernels memory-bound (`dram_throughput_pct` high, arithmetic intensity < 1);
DRAM bytes of the softmax ≈ batch × heads × L² × element size; no `flash`/`fmha`/`efficient_attention`
kernel in the window.

Expected gain: the score matrix's round trips to DRAM go away: attention time falls by roughly the
softmax/scale/mask kernels' share plus part of the two GEMMs, growing with sequence length (2-4× on the
attention block at L ≥ 512 is common; small at L ≤ 64).

Causal masks: `scores.masked_fill(~mask[..., :Lq, :Lk], very_negative)` (GPT-2 style: a boolean lower-triangular
buffer sliced from the top left; `very_negative` at most -1e30 or the scores' dtype's lowest value, e.g.
`torch.finfo(scores.dtype).min`, -65504 under float16 autocast) becomes `is_causal=True`, which SDPA aligns to
the top left too. The buffer's values are checked when the graph is compiled (pass the backend's
`example_inputs`: Dynamo lifts buffers to graph inputs), so a mask that is not a lower triangle is left alone; a
buffer rewritten after compilation is not re-checked.
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


CAST_METHODS = ("float", "to", "type_as", "half", "bfloat16")


def _through_cast(node: Any) -> Any:
    """What a single-use dtype cast (`x.float()`, `x.to(dtype)`, `x.type_as(y)`) casts; `node` itself otherwise (a
    `.to` that names a device, or anything besides a dtype, too)."""
    if not (isinstance(node, fx.Node) and node.op == "call_method" and node.target in CAST_METHODS
            and len(node.users) == 1):
        return node
    if node.target == "to" and (node.kwargs or len(node.args) != 2 or not isinstance(node.args[1], torch.dtype)):
        return node  # Dynamo writes `.to(q.dtype)` with the dtype itself
    return node.args[0]


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


def _tensor_of(gm: fx.GraphModule, node: Any, example_inputs: list[Any] | None) -> torch.Tensor | None:
    """The real tensor behind a graph input or an attribute, when the backend's example inputs are given."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "get_attr":
        value: Any = gm
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        return value if isinstance(value, torch.Tensor) else None
    if node.op == "placeholder" and example_inputs is not None:
        index = [n for n in gm.graph.nodes if n.op == "placeholder"].index(node)
        value = example_inputs[index] if index < len(example_inputs) else None
        return value if isinstance(value, torch.Tensor) else None
    return None


def _top_left(index: Any, ndim: int) -> bool:
    """True for an index of plain slices from 0 (e.g. `[:, :, :L, :L]`)."""
    parts = index if isinstance(index, tuple) else (index,)
    return len(parts) <= ndim and all(
        isinstance(p, slice) and p.start in (None, 0) and p.step in (None, 1) for p in parts
    )


def _masks_out(fill: float, scores: Any) -> bool:
    """True when `fill` removes a score from the softmax: at most -1e30, or the lowest value of the scores'
    dtype (`torch.finfo(dtype).min`, -65504 for float16 scores under autocast)."""
    value = scores.meta.get("example_value") if isinstance(scores, fx.Node) else None
    lowest = torch.finfo(value.dtype).min if isinstance(value, torch.Tensor) and value.is_floating_point() else -1e30
    return fill <= max(lowest, -1e30)


def _causal(gm: fx.GraphModule, node: Any, example_inputs: list[Any] | None) -> Any:
    """The scores under `scores.masked_fill(~tril[:, :, :Lq, :Lk], very_negative)`, else None."""
    is_method = isinstance(node, fx.Node) and node.op == "call_method" and node.target == "masked_fill"
    if not (is_method or _call(node, (torch.masked_fill,))) or len(node.users) != 1 or len(node.args) != 3:
        return None
    scores, keep_out, fill = node.args
    if not isinstance(fill, numbers.Real) or not _masks_out(fill, scores) \
            or not _call(keep_out, (operator.invert, torch.bitwise_not)):
        return None
    sliced = keep_out.args[0]
    if not _call(sliced, (operator.getitem,)):
        return None
    buffer, index = sliced.args
    mask = _tensor_of(gm, buffer, example_inputs)
    if mask is None or mask.dtype != torch.bool or mask.dim() < 2 or not _top_left(index, mask.dim()):
        return None
    rows, cols = mask.shape[-2:]
    triangle = torch.ones(rows, cols, dtype=torch.bool, device=mask.device).tril()
    return scores if bool((mask == triangle).all()) else None


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


def substitute_sdpa(gm: fx.GraphModule, example_inputs: list[Any] | None = None) -> int:
    """Rewrite each matched attention as one `scaled_dot_product_attention` call; return how many. With the
    backend's `example_inputs`, a causal `masked_fill` of a lower-triangular boolean buffer becomes
    `is_causal=True`."""
    graph = gm.graph
    count = 0
    for out in list(graph.nodes):
        if not _call(out, MATMUL_TARGETS):
            continue
        probs_node, value = out.args
        softmax = _probabilities(probs_node)
        if softmax is None:
            continue
        logits = _softmax_input(softmax)
        causal_scores = _causal(gm, logits, example_inputs)
        scores, scale, mask = _unscale(logits if causal_scores is None else causal_scores)
        if not _call(scores, MATMUL_TARGETS) or len(scores.users) != 1:
            continue
        query, key_t = scores.args
        key = _key_of_transpose(key_t)
        if key is None or isinstance(mask, numbers.Real):
            continue
        head_dim = query.meta["example_value"].shape[-1] if "example_value" in query.meta else None
        if causal_scores is not None and mask is not None:
            continue
        kwargs: dict[str, Any] = {"attn_mask": mask, "scale": 1.0 if scale is None else scale}
        if causal_scores is not None:
            kwargs = {"is_causal": True, "scale": kwargs["scale"]}
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


def _casts_around_softmax(graph: fx.Graph) -> list[tuple[fx.Node, fx.Node, fx.Node]]:
    """(cast in, softmax, cast out) for each softmax that takes a single-use dtype cast and whose one user is one."""
    found = []
    for node in graph.nodes:
        is_method = node.op == "call_method" and node.target == "softmax"
        if not (_call(node, SOFTMAX_TARGETS) or is_method) or len(node.users) != 1:
            continue
        inner, outer = node.args[0], next(iter(node.users))
        if _through_cast(inner) is not inner and _through_cast(outer) is node:
            found.append((inner, node, outer))
    return found


def last_dim_contiguous(mask: torch.Tensor) -> torch.Tensor:
    """`mask` with a contiguous last dimension: itself when it has one (a mask broadcast over batch or heads stays a
    view), else a contiguous copy."""
    return mask if mask.stride(-1) == 1 else mask.contiguous()


def _contiguous_masks(graph: fx.Graph) -> None:
    """Each additive mask of a `scaled_dot_product_attention` call given a contiguous last dimension: every fused GPU
    kernel refuses a mask whose last dimension is strided (T5's relative-position bias,
    `embedding(buckets).permute(2, 0, 1)`), and SDPA then runs its math path, in float32 for half inputs."""
    for node in list(graph.nodes):
        mask = node.kwargs.get("attn_mask") if _call(node, (F.scaled_dot_product_attention,)) else None
        if isinstance(mask, fx.Node):
            with graph.inserting_before(node):
                node.update_kwarg("attn_mask", graph.call_function(last_dim_contiguous, (mask,)))


def substitute_sdpa_through_casts(gm: fx.GraphModule, example_inputs: list[Any] | None = None) -> int:
    """`substitute_sdpa`, also for attention whose softmax is taken in float32 between casts: the casts are taken
    out for the match and put back around each softmax it left; return how many attentions were rewritten."""
    graph = gm.graph
    taken = []
    for inner, softmax, outer in _casts_around_softmax(graph):
        softmax.replace_input_with(inner, inner.args[0])
        outer.replace_all_uses_with(softmax)
        taken.append((inner.target, inner.args[1:], softmax, outer.target, outer.args[1:]))
        graph.erase_node(outer)
        graph.erase_node(inner)
    count = substitute_sdpa(gm, example_inputs)
    _contiguous_masks(graph)
    left = set(graph.nodes)
    for up, up_args, softmax, down, down_args in taken:
        if softmax not in left:
            continue
        scores = softmax.args[0]
        with graph.inserting_before(softmax):
            softmax.replace_input_with(scores, graph.call_method(up, (scores, *up_args)))
        with graph.inserting_after(softmax):
            back = graph.call_method(down, (softmax, *down_args))
        softmax.replace_all_uses_with(back, delete_user_cb=lambda user, back=back: user is not back)
    if taken or count:
        graph.lint()
        gm.recompile()
    return count
