"""A pointwise convolution whose output is only max-pooled, as one Triton kernel that never writes that output.

PointNet-style models run a shared per-point MLP (1x1 `Conv1d`, BatchNorm, ReLU) up to a wide layer (1,024
channels over every point), then take the max over the points. Compiled, that is a GEMM writing the wide
activation (batch x 1,024 x points) and a reduction kernel reading it back: the largest tensor of the model goes to
memory and returns only to be reduced to one value per channel. Inductor fuses BatchNorm, ReLU and the max into
the reduction, but it cannot fuse a reduction into a GEMM's epilogue.

`conv1x1_max` does the whole chain in one kernel: each program multiplies a block of output channels by a block of
points, applies the per-channel affine (the convolution's bias and an eval-mode BatchNorm folded together) and the
ReLU in registers, and keeps the running max over the points; only `(batch, channels)` is written.
`fuse_conv_max(model)` rewrites the chain in a traced model: `Conv1d(kernel 1)` -> optional `BatchNorm1d` (eval) ->
optional ReLU -> max over the points (`amax(dim=2)`, `max(dim=2)[0]`, `.values`). Registered with
`torch.library.custom_op` and a fake, the op is opaque to Dynamo and Inductor, and `mode="reduce-overhead"` captures
its launch with the rest of the graph.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

LIBRARY = "operator_profiler_patterns"
POOLED_DIMS = (2, -1)  # the points' dimension of a (batch, channels, points) activation
APPLIED = "max_epilogue"
INTERPRETED_BLOCKS = {"BLOCK_N": 32, "BLOCK_P": 32, "BLOCK_K": 16}


def triton_available() -> bool:
    """Whether Triton can be imported (it ships with torch's CUDA builds)."""
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def reference_conv1x1_max(points: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                          relu: bool) -> torch.Tensor:
    """The chain as the model writes it: `weight @ points[b]` over (channels_in, points), `* scale + shift` per
    output channel, ReLU when `relu`, the max over the points; in `points`' dtype."""
    wide = torch.promote_types(points.dtype, torch.float32)  # the epilogue's arithmetic: float32 at least
    out = torch.matmul(weight.to(points.dtype), points).to(wide) * scale[:, None] + shift[:, None]
    if relu:
        out = torch.relu(out)
    return out.amax(dim=2).to(points.dtype)


@torch.library.custom_op(f"{LIBRARY}::conv1x1_max", mutates_args=())
def conv1x1_max(points: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                relu: bool) -> torch.Tensor:
    """max over the points of `relu?(weight @ points * scale + shift)`: `points` (batch, channels_in, points),
    `weight` (channels_out, channels_in), `scale` and `shift` (channels_out,) float32; returns (batch, channels_out)
    in `points`' dtype. One Triton kernel on a GPU, `reference_conv1x1_max` elsewhere."""
    if points.is_cuda and triton_available():
        return _conv1x1_max_triton(points, weight, scale, shift, relu)
    return reference_conv1x1_max(points, weight, scale, shift, relu)


@conv1x1_max.register_fake
def _(points: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
      relu: bool) -> torch.Tensor:
    return points.new_empty((points.shape[0], weight.shape[0]))


def _save(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    points, weight, scale, shift, relu = inputs
    ctx.save_for_backward(points, weight, scale, shift)
    ctx.relu = relu


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
    """The gradient to `points` (the folded weight, scale and shift are buffers): each channel's gradient reaches
    the point its max came from, through the ReLU and the affine, then back through the weight."""
    points, weight, scale, shift = ctx.saved_tensors
    wide = torch.promote_types(points.dtype, torch.float32)
    pre = torch.matmul(weight.to(points.dtype), points).to(wide) * scale[:, None] + shift[:, None]
    post = torch.relu(pre) if ctx.relu else pre
    chosen = post.argmax(dim=2, keepdim=True)
    grad_pre = torch.zeros_like(pre).scatter(2, chosen, grad.to(wide)[:, :, None])
    if ctx.relu:
        grad_pre = grad_pre * (pre > 0)
    return torch.matmul(weight.to(wide).t(), grad_pre * scale[:, None]).to(points.dtype), None, None, None, None


conv1x1_max.register_autograd(_backward, setup_context=_save)


def _conv1x1_max_triton(points: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                        relu: bool) -> torch.Tensor:
    """Launch the kernel: one program per (batch, block of output channels)."""
    import triton

    batch, channels_in, count = points.shape
    channels_out = weight.shape[0]
    weight = weight.to(points.dtype).contiguous()
    out = torch.empty((batch, channels_out), dtype=points.dtype, device=points.device)

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return batch, triton.cdiv(channels_out, meta["BLOCK_N"])

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter cannot autotune: one shape
    kernel, blocks = (_kernel(), INTERPRETED_BLOCKS) if interpreted else (_tuned(), {})
    kernel[grid](points, weight, scale.float().contiguous(), shift.float().contiguous(), out,
                    channels_in, count, channels_out, *points.stride(), weight.stride(0), weight.stride(1),
                    out.stride(0), RELU=relu, IEEE=points.dtype == torch.float32, **blocks)
    return out


@functools.cache
def _tuned():  # noqa: ANN202 - a triton Autotuner, defined on first use
    """The kernel autotuned over a few block shapes, per problem size."""
    import triton

    configs = [triton.Config({"BLOCK_N": n, "BLOCK_P": p, "BLOCK_K": k}, num_warps=w, num_stages=s)
               for n, p, k, w, s in ((128, 128, 64, 8, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3),
                                     (64, 64, 64, 4, 4), (128, 128, 32, 8, 4))]
    return triton.autotune(configs=configs, key=["channels_in", "count", "channels_out"])(_kernel())


@functools.cache
def _kernel():  # noqa: ANN202 - a triton.JITFunction, defined on first use: Triton is imported only with a GPU
    """The Triton kernel: a block of output channels of one cloud, over every point in blocks."""
    import triton
    import triton.language as tl

    @triton.jit
    def _conv1x1_max_kernel(points_ptr, weight_ptr, scale_ptr, shift_ptr, out_ptr,  # noqa: ANN001, PLR0913
                            channels_in, count, channels_out,  # noqa: ANN001
                            stride_b, stride_k, stride_p, stride_wn, stride_wk, stride_ob,  # noqa: ANN001
                            RELU: tl.constexpr, IEEE: tl.constexpr,  # noqa: ANN001, N803
                            BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr):  # noqa: ANN001, N803
        b = tl.program_id(0)
        channel = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        live = channel < channels_out
        scale = tl.load(scale_ptr + channel, mask=live, other=0.0)
        shift = tl.load(shift_ptr + channel, mask=live, other=0.0)
        best = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
        for p0 in range(0, count, BLOCK_P):
            point = p0 + tl.arange(0, BLOCK_P)
            inside = point < count
            acc = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
            for k0 in range(0, channels_in, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                w = tl.load(weight_ptr + channel[:, None] * stride_wn + k[None, :] * stride_wk,
                            mask=live[:, None] & (k[None, :] < channels_in), other=0.0)
                x = tl.load(points_ptr + b * stride_b + k[:, None] * stride_k + point[None, :] * stride_p,
                            mask=(k[:, None] < channels_in) & inside[None, :], other=0.0)
                if IEEE:  # noqa: SIM108 - a constexpr branch Triton compiles away
                    acc = tl.dot(w, x, acc, input_precision="ieee")
                else:
                    acc = tl.dot(w, x, acc)
            y = acc * scale[:, None] + shift[:, None]
            if RELU:
                y = tl.maximum(y, 0.0)
            y = tl.where(inside[None, :], y, float("-inf"))
            best = tl.maximum(best, tl.max(y, axis=1))
        tl.store(out_ptr + b * stride_ob + channel, best.to(out_ptr.dtype.element_ty), mask=live)

    return _conv1x1_max_kernel


class Conv1x1Max(nn.Module):
    """The fused chain as a module: the convolution's weight, and the per-channel scale and shift that fold its bias
    and an eval-mode BatchNorm, as buffers (the op runs in inference only)."""

    def __init__(self, conv: nn.Conv1d, norm: nn.BatchNorm1d | None, relu: bool) -> None:
        super().__init__()
        weight = conv.weight.detach()[:, :, 0]
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(weight.shape[0], device=weight.device)
        scale = torch.ones_like(bias, dtype=torch.float32)
        shift = bias.float()
        if norm is not None:
            assert norm.running_var is not None and norm.running_mean is not None
            scale = torch.rsqrt(norm.running_var.float() + norm.eps)
            if norm.weight is not None:
                scale = scale * norm.weight.detach().float()
            shift = (bias.float() - norm.running_mean.float()) * scale
            if norm.bias is not None:
                shift = shift + norm.bias.detach().float()
        self.register_buffer("weight", weight.clone())
        self.register_buffer("scale", scale)
        self.register_buffer("shift", shift)
        self.relu = relu

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return torch.ops.operator_profiler_patterns.conv1x1_max(points, self.weight, self.scale, self.shift,
                                                                 self.relu)


def _is_pointwise(module: nn.Module) -> bool:
    return (isinstance(module, nn.Conv1d) and module.kernel_size == (1,) and module.stride == (1,)
            and module.padding in ((0,), "valid") and module.dilation == (1,) and module.groups == 1
            and module.padding_mode == "zeros")


def _is_eval_norm(module: nn.Module) -> bool:
    return (isinstance(module, nn.BatchNorm1d) and not module.training and module.track_running_stats
            and module.running_mean is not None)


def _is_relu(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(modules.get(str(node.target)), nn.ReLU)
    if node.op == "call_function":
        return node.target in (torch.relu, nn.functional.relu) and not node.kwargs.get("inplace", False)
    return node.op == "call_method" and node.target == "relu"


def _pooled_input(node: fx.Node) -> fx.Node | None:
    """The tensor a max over the points reads, when `node` is one: `x.amax(2)`, `torch.amax(x, 2)`,
    `x.max(2)[0]`, `torch.max(x, 2).values` (keepdim off)."""
    def dim_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[1] if len(args) > 1 else kwargs.get("dim")

    if node.op in ("call_method", "call_function") and node.target in ("amax", torch.amax) \
            and dim_of(node.args, node.kwargs) in (*POOLED_DIMS, [2], [-1], (2,), (-1,)) \
            and not node.kwargs.get("keepdim"):
        first = node.args[0]
        return first if isinstance(first, fx.Node) else None
    if node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0 \
            or node.op == "call_function" and node.target is getattr and node.args[1] == "values":
        inner = node.args[0]
        if isinstance(inner, fx.Node) and inner.target in ("max", torch.max) and len(inner.users) == 1 \
                and dim_of(inner.args, inner.kwargs) in POOLED_DIMS and not inner.kwargs.get("keepdim"):
            first = inner.args[0]
            return first if isinstance(first, fx.Node) else None
    return None


def _single_user(node: fx.Node) -> bool:
    return len(node.users) == 1


def fuse_conv_max(model: nn.Module, tracer: Callable[[nn.Module], fx.GraphModule] = fx.symbolic_trace
                  ) -> tuple[nn.Module, int]:
    """`model` with every pointwise Conv1d -> [eval BatchNorm1d] -> [ReLU] -> max over the points replaced by one
    `Conv1x1Max`, and the number replaced; `model` itself when none matched (or it cannot be traced). Inference
    only: the fold reads BatchNorm's running statistics."""
    try:
        graph_module = tracer(model)
    except Exception:  # noqa: BLE001 - a model fx cannot trace keeps its code
        return model, 0
    modules = dict(graph_module.named_modules())
    replaced = 0
    for node in list(graph_module.graph.nodes):
        source = _pooled_input(node)
        if source is None:
            continue
        chain = source
        relu = False
        if _is_relu(chain, modules) and _single_user(chain):
            relu, chain = True, chain.args[0]  # type: ignore[assignment]
        norm = None
        if isinstance(chain, fx.Node) and chain.op == "call_module" and _is_eval_norm(modules[str(chain.target)]) \
                and _single_user(chain):
            norm, chain = modules[str(chain.target)], chain.args[0]  # type: ignore[assignment]
        if not (isinstance(chain, fx.Node) and chain.op == "call_module" and _is_pointwise(modules[str(chain.target)])
                and _single_user(chain)):
            continue
        name = f"{APPLIED}_{replaced}"
        graph_module.add_submodule(name, Conv1x1Max(modules[str(chain.target)], norm, relu))  # type: ignore[arg-type]
        with graph_module.graph.inserting_before(node):
            fused = graph_module.graph.call_module(name, (chain.args[0],))
        node.replace_all_uses_with(fused)
        replaced += 1
    if not replaced:
        return model, 0
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return graph_module, replaced
