"""knowledge/fx_patterns: each pass really rewrites Dynamo's graph and keeps eager numerics (CPU, small models).

Each test captures the FX graph Dynamo hands a torch.compile backend, counts call targets before and after
the pass, runs the rewritten graph on the same inputs and parameters, and compares with the eager model.
The passes also go through AOTAutograd (`aot_eager`) as they would inside an optimized workload's backend.
cuda_graphs can only be checked structurally on a CPU (configuration keys, output cloning): the replay
itself needs CUDA and is tested only where CUDA is available.
"""

from __future__ import annotations

import importlib.util
import math
import operator
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import PATTERNS, REPO, load_pattern, own_workload_at_small_scale
from torch import fx, nn

NAMES = ("conv_bn_fold", "qkv_fusion", "sdpa_substitution", "dtype_autocast", "channels_last", "cuda_graphs",
         "inductor_config", "graph_breaks", "bf16_weights", "whole_forward_graph", "tf32_scoped",
         "fp16_weights", "fp8_linear", "graphed_training")


_load = load_pattern


def dynamo_graph(model: nn.Module, *inputs: torch.Tensor) -> tuple[fx.GraphModule, list[Any]]:
    """The single graph Dynamo traces for `model(*inputs)` and the real values of its placeholders."""
    graphs: list[tuple[fx.GraphModule, list[Any]]] = []

    def record(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=record, fullgraph=True)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def targets(gm: fx.GraphModule) -> Counter:
    """How often each call target (function or method name) appears."""
    return Counter(n.target for n in gm.graph.nodes if n.op in ("call_function", "call_method"))


def run_graph(gm: fx.GraphModule, values: list[Any]) -> torch.Tensor:
    with torch.no_grad():
        out = gm(*values)
    return out[0] if isinstance(out, (tuple, list)) else out


def through_aot_eager(model: nn.Module, fx_pass: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The model compiled by a backend that applies `fx_pass` then delegates to aot_eager; (output, applied)."""
    applied = []

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        applied.append(fx_pass(gm))
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(*inputs)
    return out, sum(applied)


def _randomize_bn(model: nn.Module) -> None:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)


class ConvBNReLU(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=bias), nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b2(self.c2(F.relu(self.b1(self.c1(x)), inplace=True)))


class Attention(nn.Module):
    """Hand-written multi-head attention with separate q/k/v projections."""

    def __init__(self, dim: int = 16, heads: int = 2, scale_op: str = "div", masked: bool = False) -> None:
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.heads, self.scale_op, self.masked = heads, scale_op, masked

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-2, -1)
        head = d // self.heads
        scores = scores / math.sqrt(head) if self.scale_op == "div" else scores * 0.3
        if mask is not None:
            scores = scores + mask
        attn = torch.softmax(scores, dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, n, d))


# --------------------------------------------------------------------------- the files themselves


@pytest.mark.parametrize("name", NAMES)
def test_pattern_has_code_docstring_and_note(name: str) -> None:
    module = _load(name)
    doc = module.__doc__ or ""
    for topic in ("When to apply", "Trigger metrics", "Expected gain"):
        assert topic in doc or topic.lower() in doc.lower(), f"{name}.py docstring lacks '{topic}'"
    note = (PATTERNS / f"{name}.md").read_text(encoding="utf-8")
    assert f"{name}.py" in note and "IR level" in note


# --------------------------------------------------------------------------- conv_bn_fold


@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_fold_removes_batch_norms_and_keeps_numerics(bias: bool) -> None:
    fold = _load("conv_bn_fold")
    torch.manual_seed(0)
    model = ConvBNReLU(bias).eval()
    _randomize_bn(model)
    x = torch.randn(2, 3, 10, 10)
    gm, values = dynamo_graph(model, x)
    before = targets(gm)
    assert before[F.batch_norm] == 2 and before[torch.conv2d] == 2
    assert fold.fold_conv_bn(gm) == 2
    after = targets(gm)
    assert after[F.batch_norm] == 0 and after[torch.conv2d] == 2 and after[torch.rsqrt] == 2
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(run_graph(gm, values), expected, rtol=1e-4, atol=1e-5)


def test_conv_bn_fold_keeps_parameters_as_inputs() -> None:
    fold = _load("conv_bn_fold")
    torch.manual_seed(0)
    model = ConvBNReLU(False).eval()
    x = torch.randn(1, 3, 6, 6)
    gm, values = dynamo_graph(model, x)
    fold.fold_conv_bn(gm)
    _randomize_bn(model)  # new statistics and weights, same tensors: the folded graph must follow them
    model.c1.weight.data.mul_(-2.0)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(run_graph(gm, values), expected, rtol=1e-4, atol=1e-5)


def test_conv_bn_fold_leaves_training_batch_norm() -> None:
    fold = _load("conv_bn_fold")
    gm, _ = dynamo_graph(ConvBNReLU(False).train(), torch.randn(2, 3, 6, 6))
    assert fold.fold_conv_bn(gm) == 0
    assert targets(gm)[F.batch_norm] == 2


def test_conv_bn_fold_on_the_conv_block_example(example) -> None:
    fold = _load("conv_bn_fold")
    spec = importlib.util.spec_from_file_location("conv_block_for_fold", example("conv_block"))
    conv_block = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv_block)
    torch.manual_seed(0)
    model, (x,) = conv_block.get_model_and_input()
    _randomize_bn(model)
    with torch.no_grad():
        expected = model(x)
    out, applied = through_aot_eager(model, fold.fold_conv_bn, x)
    assert applied == 6
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- qkv_fusion


def test_qkv_fusion_makes_one_gemm_of_three() -> None:
    qkv = _load("qkv_fusion")
    torch.manual_seed(0)
    model = Attention().eval()
    x = torch.randn(2, 5, 16)
    gm, values = dynamo_graph(model, x)
    linear = torch._C._nn.linear
    assert targets(gm)[linear] == 4
    assert qkv.fuse_parallel_linears(gm) == 1
    after = targets(gm)
    assert F.linear is linear and after[linear] == 2, "q/k/v became one linear; the output projection stays"
    assert after[torch.cat] == 2 and after[torch.split] == 1 and after[operator.getitem] == 3
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(run_graph(gm, values), expected, rtol=1e-4, atol=1e-5)
    out, applied = through_aot_eager(model, qkv.fuse_parallel_linears, x)
    assert applied == 1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


def test_qkv_fusion_needs_a_shared_input() -> None:
    qkv = _load("qkv_fusion")

    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(y)

    gm, _ = dynamo_graph(TwoInputs(), torch.randn(2, 4), torch.randn(2, 4))
    assert qkv.fuse_parallel_linears(gm) == 0


# --------------------------------------------------------------------------- sdpa_substitution


@pytest.mark.parametrize(("scale_op", "masked"), [("div", False), ("mul", True)])
def test_sdpa_substitution_replaces_matmul_softmax_matmul(scale_op: str, masked: bool) -> None:
    sdpa = _load("sdpa_substitution")
    torch.manual_seed(0)
    model = Attention(scale_op=scale_op).eval()
    x = torch.randn(2, 6, 16)
    args = (x, torch.randn(1, 1, 6, 6)) if masked else (x,)
    gm, values = dynamo_graph(model, *args)
    before = targets(gm)
    assert before[operator.matmul] == 2 and before[torch.softmax] == 1
    assert sdpa.substitute_sdpa(gm) == 1
    after = targets(gm)
    assert after[F.scaled_dot_product_attention] == 1
    assert after[operator.matmul] == 0 and after[torch.softmax] == 0
    node = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert (node.kwargs["attn_mask"] is not None) == masked
    assert node.kwargs["scale"] == (None if scale_op == "div" else 0.3)
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(run_graph(gm, values), expected, rtol=1e-4, atol=1e-5)
    out, applied = through_aot_eager(model, sdpa.substitute_sdpa, *args)
    assert applied == 1
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


class UpcastBiasAttention(nn.Module):
    """T5's attention: unscaled scores plus a relative-position bias, the softmax taken in float32 between casts."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) + bias
        return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_substitution_looks_through_a_float32_softmax(dtype: torch.dtype) -> None:
    sdpa = _load("sdpa_substitution")
    torch.manual_seed(0)
    model = UpcastBiasAttention().eval()
    args = (*(torch.randn(2, 4, 8, 16, dtype=dtype) for _ in range(3)), torch.randn(1, 4, 8, 8, dtype=dtype))
    gm, values = dynamo_graph(model, *args)
    assert sdpa.substitute_sdpa(gm) == 0, "the casts hide the softmax from the plain pass"
    assert sdpa.substitute_sdpa_through_casts(gm) == 1
    after = targets(gm)
    assert after[F.scaled_dot_product_attention] == 1 and after[torch.softmax] == 0
    assert after["float"] == 0 and after["to"] == 0, "the casts around the softmax went with it"
    node = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert node.kwargs["attn_mask"] is not None and node.kwargs["scale"] == 1.0, "T5 does not scale its scores"
    _rewritten_matches(model, args, gm, values, 1e-4 if dtype == torch.float32 else 2e-2)


def test_sdpa_substitution_hands_sdpa_a_contiguous_mask() -> None:
    """T5's bias is `embedding(buckets).permute(2, 0, 1)`: its last dimension strided, which every fused GPU kernel
    refuses (SDPA then ran its float32 math path on the H200); the rewritten graph hands SDPA a contiguous copy."""
    sdpa = _load("sdpa_substitution")
    torch.manual_seed(0)
    model = UpcastBiasAttention().eval()
    bias = torch.randn(8, 8, 4).permute(2, 0, 1)[None]
    assert bias.stride(-1) != 1
    args = (*(torch.randn(2, 4, 8, 16) for _ in range(3)), bias)
    gm, values = dynamo_graph(model, *args)
    assert sdpa.substitute_sdpa_through_casts(gm) == 1
    node = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
    assert node.kwargs["attn_mask"].target is sdpa.last_dim_contiguous
    seen: list[torch.Tensor] = []
    real = F.scaled_dot_product_attention

    def spy(*a: Any, **kw: Any) -> torch.Tensor:
        seen.append(kw["attn_mask"])
        return real(*a, **kw)

    node.target = spy
    gm.recompile()
    _rewritten_matches(model, args, gm, values, 1e-4)
    assert seen and all(m.stride(-1) == 1 and m.is_contiguous() for m in seen)
    broadcast = torch.randn(1, 4, 8, 8).expand(2, 4, 8, 8)  # a view over the batch: its last dimension contiguous
    assert sdpa.last_dim_contiguous(broadcast) is broadcast, "a broadcast mask is not copied out to every batch"


def test_sdpa_substitution_keeps_a_softmax_whose_cast_moves_it() -> None:
    sdpa = _load("sdpa_substitution")

    class ToDevice(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k.transpose(-1, -2), dim=-1).to("cpu", torch.float32) @ v

    gm, values = dynamo_graph(ToDevice(), *(torch.randn(2, 4, 8, 16) for _ in range(3)))
    assert sdpa.substitute_sdpa_through_casts(gm) == 0
    assert targets(gm)[torch.softmax] == 1


def test_sdpa_substitution_puts_back_the_casts_of_a_softmax_it_leaves() -> None:
    sdpa = _load("sdpa_substitution")

    class OverKeys(nn.Module):  # float32 softmax over the query dimension: no attention
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax((q @ k.transpose(-1, -2)).float(), dim=-2).to(q.dtype) @ v

    model = OverKeys()
    args = tuple(torch.randn(2, 4, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    gm, values = dynamo_graph(model, *args)
    assert sdpa.substitute_sdpa_through_casts(gm) == 0
    after = targets(gm)
    assert after[torch.softmax] == 1 and after["float"] == 1 and after["to"] == 1
    softmax = next(n for n in gm.graph.nodes if n.target is torch.softmax)
    assert softmax.args[0].target == "float" and next(iter(softmax.users)).target == "to"
    torch.testing.assert_close(run_graph(gm, values), model(*args), rtol=0, atol=0)


def test_sdpa_substitution_ignores_softmax_over_another_dim() -> None:
    sdpa = _load("sdpa_substitution")

    class NotAttention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.softmax(q @ k.transpose(-2, -1), dim=1) @ v

    gm, _ = dynamo_graph(NotAttention(), *(torch.randn(2, 4, 4, 8) for _ in range(3)))
    assert sdpa.substitute_sdpa(gm) == 0
    assert targets(gm)[torch.softmax] == 1


class CausalAttention(nn.Module):
    """GPT-2's hand-written causal attention: a boolean lower-triangular buffer sliced from the top left."""

    def __init__(self, n_positions: int = 8, triangle: bool = True) -> None:
        super().__init__()
        mask = torch.ones(n_positions, n_positions, dtype=torch.bool)
        mask = mask.tril() if triangle else mask.triu()
        self.register_buffer("mask", mask.view(1, 1, n_positions, n_positions), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        length = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / q.shape[-1] ** 0.5)
        scores = scores.masked_fill(~self.mask[:, :, :length, :length], torch.finfo(scores.dtype).min)
        return torch.matmul(torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("triangle, dtype", [(True, torch.float32), (False, torch.float32), (True, torch.float16)])
def test_sdpa_substitution_turns_a_causal_masked_fill_into_is_causal(triangle: bool, dtype: torch.dtype) -> None:
    """float16 scores (under float16 autocast) are filled with finfo(float16).min = -65504: still a causal mask."""
    sdpa = _load("sdpa_substitution")
    torch.manual_seed(0)
    model = CausalAttention(triangle=triangle).eval()
    args = tuple(torch.randn(2, 3, 6, 16, dtype=dtype) for _ in range(3))
    gm, values = dynamo_graph(model, *args)
    assert targets(gm)["masked_fill"] == 1
    assert sdpa.substitute_sdpa(gm) == 0  # without the real buffer, the mask's values are unknown: no match
    assert sdpa.substitute_sdpa(gm, values) == int(triangle)
    after = targets(gm)
    assert after[F.scaled_dot_product_attention] == int(triangle)
    if triangle:
        node = next(n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention)
        assert node.kwargs["is_causal"] is True and node.kwargs["scale"] is None
        assert after["masked_fill"] == 0 and after[torch.softmax] == 0
    _rewritten_matches(model, args, gm, values, 1e-4 if dtype == torch.float32 else 2e-3)


def _rewritten_matches(
    model: nn.Module, args: tuple[torch.Tensor, ...], gm: Any, values: Any, tolerance: float,
) -> None:
    """The rewritten graph computes what the model does, within `tolerance` (relative and absolute)."""
    with torch.no_grad():
        expected = model(*args)
    torch.testing.assert_close(run_graph(gm, values), expected, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------- dtype_autocast


def test_dtype_autocast_casts_gemms_to_bf16_inside_the_graph() -> None:
    autocast = _load("dtype_autocast")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).eval()
    x = torch.randn(16, 32)
    gm, values = dynamo_graph(model, x)
    assert targets(gm)["to"] == 0
    assert autocast.cast_compute_to_bf16(gm) == 2
    assert targets(gm)["to"] == 2 * 3 + 2, "input, weight, bias cast down and the result cast back, per linear"
    for node in gm.graph.nodes:
        if node.target is torch._C._nn.linear:
            assert all(a.op == "call_method" and a.target == "to" and a.args[1] is torch.bfloat16 for a in node.args)
    got = run_graph(gm, values)
    with torch.no_grad():
        expected = model(x)
    assert got.dtype == torch.float32
    assert not torch.equal(got, expected), "bf16 arithmetic must show in the result"
    rms = expected.pow(2).mean().sqrt().item()
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2 * rms)
    assert torch.get_float32_matmul_precision() == "highest", "the pass must not touch global precision"


# --------------------------------------------------------------------------- channels_last


class _ConvInputs(fx.Interpreter):
    """Runs a graph and records whether each conv2d saw channels-last input and weight."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.seen: list[bool] = []

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target is torch.conv2d:
            self.seen.append(all(t.is_contiguous(memory_format=torch.channels_last) for t in args[:2]))
        return super().call_function(target, args, kwargs)


def test_channels_last_pass_converts_conv_inputs() -> None:
    channels_last = _load("channels_last")
    torch.manual_seed(0)
    model = ConvBNReLU(True).eval()
    x = torch.randn(2, 3, 8, 8)
    gm, values = dynamo_graph(model, x)
    assert channels_last.convert_convs_to_channels_last(gm) == 2
    assert targets(gm)["contiguous"] == 4
    runner = _ConvInputs(gm)
    with torch.no_grad():
        got = runner.run(*values)[0]
        expected = model(x)
    assert runner.seen == [True, True]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_channels_last_model_keeps_state_dict_names() -> None:
    channels_last = _load("channels_last")
    model = ConvBNReLU(True).eval()
    names = list(model.state_dict())
    converted, (x,) = channels_last.channels_last_model(model, (torch.randn(1, 3, 4, 4),))
    assert list(converted.state_dict()) == names
    assert converted.c1.weight.is_contiguous(memory_format=torch.channels_last)
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_model_lays_out_a_3d_cnn_and_its_clips_in_channels_last_3d() -> None:
    channels_last = _load("channels_last")
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 4, 3), torch.nn.BatchNorm3d(4)).eval()
    clip = torch.randn(1, 3, 4, 6, 6)
    with torch.no_grad():
        expected = model(clip)
    converted, (x, mask) = channels_last.channels_last_model(model, (clip, torch.ones(1, 3, 6, 6)))
    assert converted[0].weight.is_contiguous(memory_format=torch.channels_last_3d)
    assert x.is_contiguous(memory_format=torch.channels_last_3d) and mask.is_contiguous()
    with torch.no_grad():
        torch.testing.assert_close(converted(x), expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- cuda_graphs (structural on CPU)


def test_cuda_graph_options_are_valid_inductor_config() -> None:
    cuda_graphs = _load("cuda_graphs")
    import torch._inductor.config as config

    options = cuda_graphs.cuda_graph_options()
    assert options == {"triton.cudagraphs": True}
    assert config.triton.cudagraphs is False
    with config.patch(options):
        assert config.triton.cudagraphs is True
    assert config.triton.cudagraphs is False


def test_clone_outputs_survives_static_output_buffers() -> None:
    """A CUDA graph replays into the same output buffer; the wrapper must hand out fresh copies."""
    cuda_graphs = _load("cuda_graphs")
    static = torch.zeros(3)

    def replay(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        static.copy_(x * 2)
        return static, 7

    safe = cuda_graphs.clone_outputs(replay)
    first, tag = safe(torch.ones(3))
    second, _ = safe(torch.full((3,), 5.0))
    assert tag == 7
    assert first.data_ptr() != static.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, torch.full((3,), 2.0))
    torch.testing.assert_close(second, torch.full((3,), 10.0))


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(8, 16), nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.gelu(self.body(x)))


def test_outside_graph_leaves_the_module_out_of_the_compiled_graph() -> None:
    """The head runs eagerly after the graph: the graph returns the head's input, the head returns a fresh
    tensor, and the model's parameters and state_dict keys are untouched."""
    cuda_graphs = _load("cuda_graphs")
    torch.manual_seed(0)
    model = _Head().eval()
    keys = list(model.state_dict())
    x = torch.randn(4, 8)
    with torch.no_grad():
        expected = model(x)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    assert cuda_graphs.outside_graph(model.head) is model.head
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        first, second = compiled(x), compiled(x)
    torch.testing.assert_close(first, expected)
    assert first.data_ptr() != second.data_ptr()
    assert len(graphs) == 1
    linears = [n for n in graphs[0].graph.nodes if n.op == "call_function" and n.target is torch._C._nn.linear]
    assert len(linears) == 1  # only the first Linear was traced; the head ran outside
    assert [tuple(v.meta["example_value"].shape) for v in graphs[0].graph.find_nodes(op="output")[0].args[0]] \
        == [(4, 16)]
    assert list(model.state_dict()) == keys and model.head.weight.shape == (32, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA: only checked structurally on CPU")
def test_cuda_graph_backend_replays_on_gpu() -> None:
    cuda_graphs = _load("cuda_graphs")
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)).cuda().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=cuda_graphs.cuda_graph_backend)
    xs = [torch.randn(8, 16, device="cuda") for _ in range(4)]
    with torch.no_grad():
        outs = [compiled(x) for x in xs]
        for x, out in zip(xs, outs, strict=True):
            torch.testing.assert_close(out, model(x))


# --------------------------------------------------------------------------- inductor_config


@pytest.mark.parametrize("bottleneck", ["compute", "memory", "launch", "gemm"])
def test_inductor_presets_are_real_options(bottleneck: str) -> None:
    inductor = _load("inductor_config")
    import torch._inductor.config as config

    options = inductor.inductor_options(bottleneck)
    assert options and "freezing" not in options
    with config.patch(options):
        for key, value in options.items():
            obj: Any = config
            for part in key.split("."):
                obj = getattr(obj, part)
            assert obj == value


def test_inductor_config_rejects_unknown_names() -> None:
    inductor = _load("inductor_config")
    with pytest.raises(KeyError, match="no_such_knob"):
        inductor.check_options({"no_such_knob": True})
    with pytest.raises(ValueError, match="unknown bottleneck"):
        inductor.inductor_options("io")


def test_graph_breaks_are_found_with_their_lines_and_removed_by_the_usual_settings() -> None:
    spec = importlib.util.spec_from_file_location("graph_breaks_workload",
                                                  REPO / "scripts" / "gpu_workloads" / "graph_breaks.py")
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)
    pattern = _load("graph_breaks")
    model = workload.Broken(16).eval()
    x = torch.randn(4, 16)
    graphs, breaks = pattern.graph_breaks(model, x)
    source = (REPO / "scripts" / "gpu_workloads" / "graph_breaks.py").read_text().splitlines()
    assert graphs == 3
    lines = [int(b["location"].rsplit(":", 1)[1]) for b in breaks]
    assert [b["location"].rsplit(":", 1)[0].endswith("graph_breaks.py") for b in breaks] == [True, True]
    assert ".item()" in source[lines[0] - 1] and "print(" in source[lines[1] - 1]
    assert "item()" in breaks[0]["reason"] and "builtin operator" in breaks[1]["reason"]
    with pattern.fewer_breaks():
        graphs, breaks = pattern.graph_breaks(model, x)
        assert (graphs, breaks) == (1, [])
        with torch.no_grad():
            compiled = torch.compile(model, backend="aot_eager")(x)
    with torch.no_grad():
        torch.testing.assert_close(compiled, model(x))
    assert not torch._dynamo.config.capture_scalar_outputs


def test_bf16_weights_are_cast_once_and_only_the_edges_are_cast_per_call() -> None:
    pattern = _load("bf16_weights")
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 8)).eval()
    x = torch.randn(16, 32)
    with torch.no_grad():
        reference = mlp(x)
    wrapped = pattern.keep_in_bf16(mlp)
    assert pattern.weight_dtypes(wrapped) == {torch.bfloat16}
    gm, _ = dynamo_graph(wrapped, x)
    casts = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "to"]
    assert len(casts) == 2, "one cast in (the input), one out (the output): no weight is cast per call"
    with torch.no_grad():
        out = wrapped(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference, rtol=1e-2, atol=1e-2 * reference.pow(2).mean().sqrt().item())
    lstm = nn.LSTM(16, 32, batch_first=True).eval()  # cuDNN's fused RNN on a GPU; the same cast on the CPU
    seq = torch.randn(4, 10, 16)
    with torch.no_grad():
        ref_out, _ = lstm(seq)
        low_out, (h, c) = pattern.keep_in_bf16(lstm)(seq)
    assert low_out.dtype == h.dtype == torch.float32
    assert (low_out - ref_out).abs().max() <= 2e-2


# --------------------------------------------------------------------------- whole_forward_graph


class Encoder(nn.Module):
    """Embedding, LSTM and a head on the last hidden state (the shape of examples/lstm_sequence_encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(50, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        _, (h_n, _) = self.lstm(self.embedding(ids))
        return self.head(h_n[-1])


def test_whole_forward_graph_compiles_around_rnns_and_passes_through_without_cuda() -> None:
    pattern = _load("whole_forward_graph")
    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.randint(0, 50, (4, 7))
    with torch.no_grad():
        expected = model(ids)
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=record)(ids)
    assert graphs == [], "Dynamo skips the frame that calls the LSTM: plain torch.compile compiles nothing"
    torch._dynamo.reset()  # forget the skipped frames (Module._call_impl's code among them)
    assert pattern.compile_around_rnns(model, record) == 2  # the embedding and the head
    assert sorted(name for name, _ in model.state_dict().items())[:2] == ["embedding.weight", "head.bias"]
    captures: list[int] = []
    run = pattern.graph_whole_forward(model, on_capture=lambda: captures.append(1))
    with torch.no_grad():
        got = run(ids)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert len(graphs) == 2 and not any(isinstance(m, nn.LSTM) for gm in graphs for m in gm.modules())
    assert captures == [], "no CUDA graph is captured on the CPU"


def test_detach_head_takes_the_head_out_of_the_forward_for_the_caller_to_apply() -> None:
    pattern = _load("whole_forward_graph")
    torch.manual_seed(0)
    model = Encoder().eval()
    ids = torch.randint(0, 50, (4, 7))
    with torch.no_grad():
        expected = model(ids)
        head = pattern.detach_head(model, "head")
        body = pattern.graph_whole_forward(model)
        got = head(body(ids))
    assert isinstance(model.head, nn.Identity) and isinstance(head, nn.Linear)
    assert not any(name.startswith("head.") for name in model.state_dict())
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


# --------------------------------------------------------------------------- tf32_scoped


def test_tf32_is_on_inside_the_call_and_restored_after_it() -> None:
    pattern = _load("tf32_scoped")
    flags = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(f.allow_tf32 for f in flags)
    seen: list[tuple[bool, ...]] = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(f.allow_tf32 for f in flags))
        if x.sum() < 0:
            raise ValueError("negative")
        return x * 2

    for value in (False, True):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = value
        run = pattern.with_tf32(model)
        torch.testing.assert_close(run(torch.ones(3)), torch.full((3,), 2.0))
        with pytest.raises(ValueError):
            run(-torch.ones(3))
        assert seen[-2:] == [(True, True), (True, True)]
        assert tuple(f.allow_tf32 for f in flags) == (value, value), "restored, also after an exception"
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# --------------------------------------------------------------------------- fp16_weights


class TiedHead(nn.Module):
    """Embedding, a Linear, a LayerNorm and a head tied to the embedding (GPT-2's lm_head/wte)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(40, 24)
        self.fc = nn.Linear(24, 24)
        self.norm = nn.LayerNorm(24)
        self.head = nn.Linear(24, 40, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.relu(self.fc(self.wte(ids)))))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp16_weights_are_stored_once_and_no_weight_is_cast_per_call(dtype: torch.dtype) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    pattern = _load("fp16_weights")
    torch.manual_seed(0)
    model = TiedHead().eval()
    ids = torch.randint(0, 40, (4, 6))
    with torch.no_grad():
        reference = model(ids)
    keys = list(model.state_dict())
    pattern.cast_matmul_weights(model, dtype)
    assert list(model.state_dict()) == keys, "module paths and state_dict keys unchanged"
    assert model.fc.weight.dtype == model.fc.bias.dtype == dtype
    assert model.head.weight is model.wte.weight and model.wte.weight.dtype == dtype, "the tied weight follows"
    assert model.norm.weight.dtype == torch.float32, "normalisations keep float32"
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}

    class Casts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype):
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    seen: list[bool] = []
    model.fc.register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_enabled("cpu")))
    run = pattern.with_autocast(model, dtype)
    with torch.no_grad(), Casts() as casts:
        out = run(ids)
    assert seen == [True] and not torch.is_autocast_enabled("cpu"), "autocast on during the call only"
    assert not weight_shapes & set(casts.shapes), f"a weight was cast during the call: {casts.shapes}"
    assert out.dtype == torch.float32, "the autocast dtype comes back as float32"
    rms = reference.pow(2).mean().sqrt().item()
    torch.testing.assert_close(out, reference, rtol=1e-2 if dtype == torch.float16 else 4e-2, atol=1e-2 * rms)
    with torch.no_grad(), Casts() as casts:
        kept = pattern.with_autocast_keep_dtype(model, dtype)(ids)
    assert kept.dtype == dtype, "with_autocast_keep_dtype leaves the output as autocast returns it"
    assert tuple(kept.shape) not in casts.shapes, "and casts no output"
    assert torch.equal(kept.float(), out), "the same values, before the cast back"


def test_autocast_in_forward_puts_the_autocast_region_inside_the_compiled_graph() -> None:
    """autocast_in_forward: the compiled graph holds the float16 region and the cast back (one graph, no
    recompile, nothing wrapping the compiled model), outputs float32 (or float16 with out_dtype=None), state_dict
    keys unchanged, autocast off outside the call."""
    pattern = _load("fp16_weights")
    torch.manual_seed(0)
    model = TiedHead().eval()
    ids = torch.randint(0, 40, (4, 6))
    with torch.no_grad():
        reference = model(ids)
    keys = list(model.state_dict())
    pattern.cast_matmul_weights(model, torch.bfloat16)
    pattern.autocast_in_forward(model, torch.bfloat16)
    assert list(model.state_dict()) == keys
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        out = compiled(ids)
        again = compiled(torch.randint(0, 40, (4, 6)))
    assert len(graphs) == 1, "one graph, reused: the autocast region is traced, not a guard that recompiles"
    assert not torch.is_autocast_enabled("cpu")
    code = graphs[0].code
    assert "autocast" in code and "bfloat16" in code, "the graph holds the autocast region"
    assert out.dtype == again.dtype == torch.float32
    rms = reference.pow(2).mean().sqrt().item()
    torch.testing.assert_close(out, reference, rtol=4e-2, atol=4e-2 * rms)
    kept = pattern.autocast_in_forward(TiedHead().eval(), torch.bfloat16, out_dtype=None)
    with torch.no_grad():
        assert kept(ids).dtype == torch.bfloat16


def test_module_paths_of_a_model_whose_forward_was_set_on_the_instance_are_its_own() -> None:
    """With autocast_in_forward, Dynamo reaches the model through the wrapper's bound forward
    (`L['forward'].__self__.fc`); the capture child's module paths are still the model's own (`fc`, `norm`)."""
    from mcp_server.children.compiling import record_node_modules

    pattern = _load("fp16_weights")
    model = pattern.autocast_in_forward(TiedHead().eval(), torch.bfloat16)
    recorded: dict[str, dict[str, str]] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        record_node_modules(gm, recorded, root="TiedHead")
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(torch.randint(0, 40, (4, 6)))
    paths = {entry["module_path"] for entry in recorded.values() if entry}
    assert {"fc", "norm", "head"} <= paths, paths
    assert not any("__self__" in p or p.startswith("L.") for p in paths), paths


# --------------------------------------------------------------------------- fp8_linear


class Block(nn.Module):
    """A pre-norm transformer block with hand-written projections (all plain nn.Linear)."""

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.n1, self.n2, self.up, self.down = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), \
            nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        y = self.n1(x)
        q, k, v = (p(y).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.n2(x))))


def _fp8_error(model: nn.Module, x: torch.Tensor, fp8: ModuleType) -> tuple[list[str], float, bool]:
    """(paths replaced, max error over the output's RMS, within the fp8 tier by validate's rule)."""
    with torch.no_grad():
        ref = model(x)
        paths = fp8.to_fp8_linear(model)
        out = model(x)
    rms = ref.pow(2).mean().sqrt()
    err = (out - ref).abs()
    return paths, float(err.max() / rms), bool((err <= fp8.FP8_RTOL * (rms + ref.abs())).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fp8_linear_keeps_paths_and_stays_within_the_fp8_tier(seed: int) -> None:
    from mcp_server.schema.recipes import TIER_RTOL

    fp8 = _load("fp8_linear")
    assert TIER_RTOL["fp8"] == fp8.FP8_RTOL, "the pattern states the tier's tolerance"
    torch.manual_seed(seed)
    mlp = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512), nn.GELU(), nn.Linear(512, 10))
    paths, worst, within = _fp8_error(mlp, torch.randn(64, 512), fp8)
    assert paths == ["0", "2"], "the 10-wide head is too narrow for an FP8 GEMM: left as it is"
    assert isinstance(mlp[0], fp8.Fp8Linear) and type(mlp[4]) is nn.Linear
    assert mlp[0].weight_fp8.dtype == torch.float8_e4m3fn and mlp[0].weight_scale.dtype == torch.float32
    assert 0.0 < worst < fp8.FP8_RTOL and within
    blocks = nn.Sequential(Block(), Block())
    paths, worst, within = _fp8_error(blocks, torch.randn(8, 32, 256), fp8)
    assert len(paths) == 12 and "1.down" in paths
    assert worst < 0.1 and within, "residuals carry the signal past the GEMMs: a smaller error"


def test_fp8_layer_choice_keeps_the_model_within_the_tolerance_it_is_given() -> None:
    """The layers to run in FP8 are chosen from each one's error alone, least harmful first, while the whole model
    stays within margin x rtol; the model itself is left as it was."""
    fp8 = _load("fp8_linear")
    torch.manual_seed(0)
    blocks, x = nn.Sequential(Block(), Block()), torch.randn(8, 32, 256)
    with torch.no_grad():
        ref = blocks(x)
    everything, alone = fp8.fp8_layer_choice(blocks, (x,), ref)
    assert sorted(everything) == sorted(alone) and len(alone) == 12, "at the tier's 0.25 every layer fits"
    chosen, alone = fp8.fp8_layer_choice(blocks, (x,), ref, rtol=0.03)
    assert 0 < len(chosen) < 12 and type(blocks[0].q) is nn.Linear
    assert [alone[p] for p in chosen] == sorted(alone[p] for p in chosen)
    fp8.to_fp8_linear(blocks, paths=chosen)
    with torch.no_grad():
        assert fp8.worst_error(blocks(x), ref) <= 0.8 * 0.03
    assert {p for p, m in blocks.named_modules() if isinstance(m, fp8.Fp8Linear)} == set(chosen)


DECODER_AGAINST = """
import json, torch, decoder_stack as base, {name} as opt
torch.manual_seed(0)
model, inputs = base.get_model_and_input()
other, _ = opt.get_model_and_input()
other.load_state_dict(model.state_dict())
with torch.no_grad():
    ref, out = model(*inputs), opt.optimize(other)(*opt.prepare_inputs(inputs))
"""  # the own decoder and its optimized workload `name` on the same weights and inputs: `ref` and `out`


@pytest.mark.parametrize("name, layers", [("decoder_stack_fp8", 14), ("decoder_stack_fp8_chosen", 3)])
def test_the_own_decoders_fp8_workloads_replace_their_linears_at_the_small_scale(name: str, layers: int) -> None:
    """scripts/gpu_workloads/decoder_stack_fp8.py (measured on the H200 against its tier's winner) and its variant on
    the layers fp8_layer_choice kept (named for the full model: 3 of them exist at the small scale) run on the CPU at
    the small scale as a user's process would: the output in bfloat16, its error of the size the GPU measured (p50
    about 4 % of |ref| + RMS with every layer in FP8)."""
    check = DECODER_AGAINST.format(name=name) + """
rel = ((out.double() - ref.double()).abs() / (ref.abs().double() + ref.double().pow(2).mean().sqrt())).flatten()
print(json.dumps([str(out.dtype), opt.APPLIED_PASSES, float(rel.median()), float(rel.max())]))
"""
    dtype, passes, median, worst = own_workload_at_small_scale(check)
    assert dtype == "torch.bfloat16" and passes == {"bf16_weights": 1, "fp8_linear": layers}
    assert 0.001 < median < 0.1 and median < worst


def test_the_own_decoders_gemm_tuned_workload_compiles_with_the_gemm_preset_at_the_small_scale() -> None:
    """scripts/gpu_workloads/decoder_stack_gemm_tuned.py (the reduced winner's lines with the GEMMs alone autotuned)
    compiles through its backend on the CPU at the small scale: float16 out, within the reduced tier."""
    check = DECODER_AGAINST.format(name="decoder_stack_gemm_tuned") + """
print(json.dumps([str(out.dtype), opt.APPLIED_PASSES, float((out.float() - ref).abs().max() / ref.abs().max())]))
"""
    dtype, passes, error = own_workload_at_small_scale(check)
    assert dtype == "torch.float16" and passes == {"fp16_weights": 1, "inductor_gemm_autotune": 1}
    assert error < 1e-2


def test_fp8_linear_runs_where_fp8_gemms_do() -> None:
    fp8 = _load("fp8_linear")
    assert fp8.fp8_supported("cpu"), "the CPU's _scaled_mm is a reference implementation"
    if torch.cuda.is_available():
        assert fp8.fp8_supported("cuda") == (torch.cuda.get_device_capability() >= (8, 9))


def test_fp8_linear_leaves_the_encoder_layers_fast_path_alone() -> None:
    fp8 = _load("fp8_linear")
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True).eval()
    model = nn.Sequential(layer, nn.Linear(256, 256))
    x = torch.randn(2, 16, 256)
    with torch.no_grad():
        paths = fp8.to_fp8_linear(model)
        model(x)  # the layer's fused path still finds its linears' weights
    assert paths == ["1"]


def test_fp8_linear_compiles_and_keeps_half_inputs_in_their_dtype() -> None:
    fp8 = _load("fp8_linear")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    x = torch.randn(16, 256)
    with torch.no_grad():
        ref = model(x)
        fp8.to_fp8_linear(model)
        torch._dynamo.reset()
        out = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
        half = model(x.to(torch.bfloat16))
    assert out.dtype == torch.float32 and half.dtype == torch.bfloat16
    rms = ref.pow(2).mean().sqrt()
    assert bool(((out - ref).abs() <= fp8.FP8_RTOL * (rms + ref.abs())).all())


def test_graphed_training_hands_back_the_module_without_cuda() -> None:
    pattern = _load("graphed_training")
    model = nn.GRU(4, 4, batch_first=True)
    assert pattern.graph_training_module(model, (torch.randn(2, 3, 4, requires_grad=True),)) is model
