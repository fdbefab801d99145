"""Time what a user gets for free (torch.compile, reduce-overhead, bf16 autocast) beside candidate changes.

    python benchmarks/free_recipes.py [EXAMPLE ...] [--out FILE]

For each example in examples/ (full size, on the GPU): the baseline eager, under torch.compile, under
mode="reduce-overhead", both under bf16 autocast, and candidate changes built from knowledge/fx_patterns/ (BF16
weights, CUDA graphs, QKV fusion, causal SDPA, the whole forward in one CUDA graph, channels_last). Each recipe
gets the baseline's weights, 10 warm-up calls, then the median of 100 calls timed with CUDA events under
torch.no_grad(); `err` is max |out - ref| / max |ref| against float32 eager. Exploratory: `operator-profiler bench`
gives the speedups with intervals that the reports state.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "knowledge" / "fx_patterns"))

from bf16_weights import keep_in_bf16  # noqa: E402
from conv_bn_fold import fold_conv_bn  # noqa: E402
from cuda_graphs import clone_outputs  # noqa: E402
from qkv_fusion import fuse_parallel_linears  # noqa: E402
from whole_forward_graph import graph_whole_forward  # noqa: E402

EXAMPLES = ("mlp_activations", "lstm_sequence_encoder", "sdpa_attention", "gpt2", "embedding_projection",
            "depthwise_separable_conv")
Build = Callable[[nn.Module, tuple[Any, ...]], tuple[Callable[..., Any], tuple[Any, ...]]]


def backend(passes: tuple[Callable[[Any], Any], ...] = (), cudagraphs: bool = True,
            extra: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A torch.compile backend: the FX passes, then Inductor (CUDA graphs on, outputs cloned, by default)."""
    from torch._inductor.compile_fx import compile_fx

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        for fx_pass in passes:
            fx_pass(gm)
        gm.recompile()
        compiled = compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": cudagraphs, **(extra or {})})
        return clone_outputs(compiled) if cudagraphs else compiled

    return compile_graph


def autocast(fn: Callable[..., Any], dtype: torch.dtype = torch.bfloat16) -> Callable[..., Any]:
    """`fn` under autocast to `dtype` (bf16 by default), its outputs left as autocast gives them."""

    def run(*args: Any) -> Any:
        with torch.autocast("cuda", dtype=dtype):
            return fn(*args)

    return run


def causal_sdpa(model: nn.Module) -> nn.Module:
    """gpt2's attention blocks computed by SDPA with is_causal=True (module-level stand-in for the FX pass)."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.n_head, self.head_dim).transpose(1, 2) for t in self.c_attn(x).split(d, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(out.transpose(1, 2).contiguous().view(b, s, d))

    for module in model.modules():
        if type(module).__name__ == "CausalSelfAttention":
            module.forward = types.MethodType(forward, module)
    return model


def half(model: nn.Module) -> Callable[..., Any]:
    """The model in float16, float32 in and out."""
    model = model.half()
    return lambda *args: model(*(a.half() if a.is_floating_point() else a for a in args)).float()


def channels_last(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...]]:
    return (model.to(memory_format=torch.channels_last),
            tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs))


def recipes(name: str) -> dict[str, Build]:
    """The free recipes and the candidates tried on `name`."""
    out: dict[str, Build] = {
        "eager": lambda m, i: (m, i),
        "inductor": lambda m, i: (torch.compile(m), i),
        "ro": lambda m, i: (torch.compile(m, mode="reduce-overhead"), i),
        "inductor-bf16": lambda m, i: (autocast(torch.compile(m)), i),
        "ro-bf16": lambda m, i: (autocast(torch.compile(m, mode="reduce-overhead")), i),
        "bf16w+cg": lambda m, i: (torch.compile(keep_in_bf16(m), backend=backend()), i),
    }
    autotune = {"max_autotune": True, "max_autotune_gemm_backends": "TRITON,ATEN"}
    if name in ("mlp_activations", "embedding_projection", "sdpa_attention"):
        out["bf16w+cg+autotune"] = lambda m, i: (torch.compile(keep_in_bf16(m), backend=backend(extra=autotune)), i)
    if name == "sdpa_attention":
        qkv = backend((fuse_parallel_linears,))
        out["bf16w+qkv+cg"] = lambda m, i: (torch.compile(keep_in_bf16(m), backend=qkv), i)
    if name == "gpt2":
        out["bf16w+causal+cg"] = lambda m, i: (torch.compile(keep_in_bf16(causal_sdpa(m)), backend=backend()), i)
        out["causal+ro (fp32)"] = lambda m, i: (torch.compile(causal_sdpa(m), mode="reduce-overhead"), i)
    if name == "embedding_projection":
        out["bf16w+cg bf16-out"] = lambda m, i: (
            torch.compile(keep_in_bf16(m, out_dtype=torch.bfloat16), backend=backend()), i)
    if name == "lstm_sequence_encoder":
        out["bf16w eager"] = lambda m, i: (keep_in_bf16(m), i)
        out["fp16w eager"] = lambda m, i: (half(m), i)
        out["graph fp32"] = lambda m, i: (graph_whole_forward(m), i)
        out["graph bf16w"] = lambda m, i: (graph_whole_forward(keep_in_bf16(m)), i)
        out["graph fp16w"] = lambda m, i: (graph_whole_forward(half(m)), i)
    if name == "depthwise_separable_conv":
        out["cl+fold+cg (fp32)"] = lambda m, i: (lambda cm, ci: (
            torch.compile(cm, backend=backend((fold_conv_bn,))), ci))(*channels_last(m, i))
        out["cl+bf16w+fold+cg"] = lambda m, i: (lambda cm, ci: (
            torch.compile(keep_in_bf16(cm), backend=backend((fold_conv_bn,))), ci))(*channels_last(m, i))
    return out


def median_ms(fn: Callable[..., Any], inputs: tuple[Any, ...], calls: int = 100) -> float:
    """Median of `calls` CUDA-event timings after 10 warm-up calls, a CUDA-graph step marked before each call (as
    bench does)."""
    with torch.no_grad():
        for _ in range(10):
            torch.compiler.cudagraph_mark_step_begin()
            fn(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(calls):
            torch.compiler.cudagraph_mark_step_begin()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(name: str) -> dict[str, dict[str, Any]]:
    """Every recipe of one example: median ms, error against float32 eager, build time."""
    sys.path.insert(0, str(REPO / "examples" / name))
    workload = importlib.import_module(name)
    torch.manual_seed(0)
    reference_model, inputs = workload.get_model_and_input()
    with torch.no_grad():
        reference = reference_model(*inputs).float()
    rows: dict[str, dict[str, Any]] = {}
    for label, build in recipes(name).items():
        torch._dynamo.reset()
        started = time.time()
        try:
            torch.manual_seed(0)
            model, _ = workload.get_model_and_input()
            model.load_state_dict(reference_model.state_dict())
            fn, args = build(model, inputs)
            ms = median_ms(fn, args)
            with torch.no_grad():
                error = ((fn(*args).float() - reference).abs().max() / reference.abs().max()).item()
            rows[label] = {"ms": round(ms, 4), "err": float(f"{error:.2e}"), "build_s": round(time.time() - started, 1)}
        except Exception as exc:  # a candidate that does not build is a result too
            rows[label] = {"error": repr(exc)[:300]}
        print(name, label, rows[label], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--out", type=Path, default=Path("free_recipes.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: the recipes differ only there")
    result = {name: measure(name) for name in args.examples}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
