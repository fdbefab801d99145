"""gpt2, optimized beyond the free frontier, reduced tier
(evidence: examples/gpt2/recipes.json, NVIDIA H100 80GB HBM3).

1. The tier's winner, `reduce-overhead+fp16-cast` (recipes.json: 1143.9 µs per call alone, 1013.5 µs per call back
   to back; largest relative error against fp32 eager 0.0057): the whole model cast to float16, its inputs converted
   once by `prepare_inputs`; recorded as `fp16_weights`.
2. `sdpa_substitution` (functional FX pass, knowledge/fx_patterns/sdpa_substitution.py): each of the 12
   hand-written causal attentions (matmul, scale, masked_fill with the lower-triangular buffer, softmax, matmul:
   120 kernels in profile.json) becomes one `scaled_dot_product_attention(..., is_causal=True)` call, one fused
   attention kernel; the buffer is checked to be a lower triangle when the graph is compiled. The free recipes
   compile the attention as written.
3. `whole_forward_graph` (module level, knowledge/fx_patterns/whole_forward_graph.py): the winner ran under
   `torch.compile(mode="reduce-overhead")`, whose CUDA graph trees check guards, inputs and outputs on every call; a
   call alone took 130.4 µs more than queued back to back, host work the GPU waits for. Here Inductor compiles the
   same graph without CUDA graphs (this workload's backend) and the whole call is captured in one
   `torch.cuda.CUDAGraph` per input signature and replayed: each call copies its inputs in, replays and returns
   copies of the outputs.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from gpt2 import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx
from torch.utils._pytree import tree_flatten, tree_map

BACKEND_NAME = "gpt2_opt"
APPLIED_PASSES: dict[str, int] = {}
WARMUP_CALLS = 3

# copied from knowledge/fx_patterns/sdpa_substitution.py
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


# copied from knowledge/fx_patterns/whole_forward_graph.py
def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    leaves, _ = tree_flatten(args)
    return tuple((tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x for x in leaves)


class _Captured:
    """One input signature's graph: its static inputs, static outputs and the graph to replay."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.inputs = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, args)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*self.inputs)

    def __call__(self, args: tuple[Any, ...]) -> Any:
        for static, value in zip(tree_flatten(self.inputs)[0], tree_flatten(args)[0], strict=True):
            if isinstance(static, torch.Tensor):
                static.copy_(value)
        self.graph.replay()
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, self.outputs)


def graph_whole_forward(fn: Callable[..., Any], on_capture: Callable[[], None] | None = None) -> Callable[..., Any]:
    """`fn` replayed from one CUDA graph per input signature, outputs cloned; `fn` itself on a CPU or when
    gradients are on (a captured forward records no autograd graph). `on_capture` runs after each capture."""
    graphs: dict[tuple[Any, ...], _Captured] = {}

    def run(*args: Any) -> Any:
        leaves, _ = tree_flatten(args)
        on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in leaves)
        if not on_cuda or torch.is_grad_enabled():
            return fn(*args)
        key = _signature(args)
        if key not in graphs:
            graphs[key] = _Captured(fn, args)
            if on_capture is not None:
                on_capture()
        return graphs[key](args)

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def gpt2_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Substitute fused causal attention, record it, and compile with Inductor's default options, no CUDA graphs:
    the whole call is captured around it."""
    from torch._inductor.compile_fx import compile_fx

    if applied := substitute_sdpa(gm, example_inputs):
        APPLIED_PASSES["sdpa_substitution"] = APPLIED_PASSES.get("sdpa_substitution", 0) + applied
        gm.recompile()
    APPLIED_PASSES["inductor"] = APPLIED_PASSES.get("inductor", 0) + 1
    return compile_fx(gm, example_inputs)


def _captured() -> None:
    APPLIED_PASSES["whole_forward_graph"] = APPLIED_PASSES.get("whole_forward_graph", 0) + 1


def optimize(model: torch.nn.Module) -> Any:
    """The model in float16, compiled with this workload's backend, each call replayed from
    one CUDA graph per input signature on a GPU (taking inputs converted by `prepare_inputs`)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(torch.float16)
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return graph_whole_forward(torch.compile(model, backend=BACKEND_NAME), on_capture=_captured)


def prepare_inputs(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The baseline's inputs as the optimized call takes them, converted once before the calls."""
    inputs = tuple(x.to(torch.float16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    return inputs
