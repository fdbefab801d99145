"""gpt2, optimized for inference on the GPU in the reduced precision tier (evidence: examples/gpt2/analysis.json, H100).

1. `fp16_weights` (module level, knowledge/fx_patterns/fp16_weights.py): 73 float32 GEMMs run on CUDA cores
   (tensor pipe 0 %, 4.46 ms of kernel time). The Linear weights (the tied lm_head/wte included) are stored in
   float16 once and each call runs under float16 autocast, outputs returned as float32: FP16 tensor cores
   without autocast's per-call weight casts. Tried before it, on the H100: BF16 weights (bf16_weights.py),
   4.37x over eager but the logits' max relative error was 4.1-4.5 % > the reduced tier's 1e-2 (FAIL); TF32
   (tf32_scoped.py), PASS at 4.5e-3 but 1.088x over the best free recipe. FP16 keeps TF32's 10 mantissa bits
   at BF16's tensor-core rate.
2. `sdpa_substitution` (functional FX pass, knowledge/fx_patterns/sdpa_substitution.py): each of the 12
   hand-written causal attentions (matmul, scale, masked_fill with the lower-triangular buffer, softmax,
   matmul: 120 kernels) becomes one `scaled_dot_product_attention(..., is_causal=True)` call (one fused
   attention kernel); the buffer is checked to be a lower triangle when the graph is compiled.
3. `cuda_graphs` (inductor-config, knowledge/fx_patterns/cuda_graphs.py): the window is launch-bound (GPU
   busy 49.7 % of 10.0 ms without the profiler); Inductor compiles it with CUDA graphs on and the outputs
   cloned.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from gpt2 import get_model_and_input  # noqa: F401 - same model and inputs as the baseline
from torch import fx, nn
from torch.utils._pytree import tree_map

BACKEND_NAME = "gpt2_opt"
APPLIED_PASSES: dict[str, int] = {}

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




def clone_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a compiled callable so every tensor it returns is a fresh copy (safe across CUDA graph replays)."""

    def run(*args: Any) -> Any:
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled(*args))

    return run

MATMUL_MODULES: tuple[type[nn.Module], ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)


def cast_matmul_weights(model: nn.Module, dtype: torch.dtype = torch.float16) -> nn.Module:
    """The same model with the parameters of its Linear and convolution modules stored in `dtype` once, in
    place; every other parameter and buffer (norms, embeddings not tied to a Linear) keeps its dtype."""
    for module in model.modules():
        if isinstance(module, MATMUL_MODULES):
            module.to(dtype)
    return model


def with_autocast(fn: Callable[..., Any], dtype: torch.dtype = torch.float16) -> Callable[..., Any]:
    """`fn` run under `torch.autocast(dtype=dtype)` on the device of its tensor arguments (CUDA when any is on
    CUDA, else CPU); outputs in `dtype` come back as float32, every other output unchanged."""

    def run(*args: Any, **kwargs: Any) -> Any:
        leaves: list[Any] = []
        tree_map(leaves.append, (args, kwargs))
        device = "cuda" if any(isinstance(v, torch.Tensor) and v.is_cuda for v in leaves) else "cpu"
        with torch.autocast(device, dtype=dtype):
            out = fn(*args, **kwargs)
        return tree_map(lambda v: v.float() if isinstance(v, torch.Tensor) and v.dtype == dtype else v, out)

    return run


@torch._dynamo.register_backend(name=BACKEND_NAME)
def gpt2_backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """Substitute fused causal attention, record it, and compile with Inductor; on CUDA with CUDA graphs on
    and the outputs cloned (recorded as `cuda_graphs`)."""
    from torch._inductor.compile_fx import compile_fx

    if applied := substitute_sdpa(gm, example_inputs):
        APPLIED_PASSES["sdpa_substitution"] = APPLIED_PASSES.get("sdpa_substitution", 0) + applied
    gm.recompile()
    if not any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        return compile_fx(gm, example_inputs)
    APPLIED_PASSES["cuda_graphs"] = APPLIED_PASSES.get("cuda_graphs", 0) + 1
    return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))


def optimize(model: torch.nn.Module) -> Any:
    """The model, its Linear weights stored in float16, compiled with this workload's registered backend and
    run under float16 autocast (outputs returned as float32)."""
    APPLIED_PASSES["fp16_weights"] = APPLIED_PASSES.get("fp16_weights", 0) + 1
    return with_autocast(torch.compile(cast_matmul_weights(model), backend=BACKEND_NAME))
