"""Reduced-tier candidates against the free bf16-autocast recipe, with validate's error metric.

    python benchmarks/reduced_tier_candidates.py [EXAMPLE ...] [--own] [--out FILE]

For each example in examples/ (full size, on the GPU), and with `--own` for a transformer encoder and a CNN that
are not examples: eager, `mode="reduce-overhead"`, that under bf16 and under float16 autocast, TF32 scoped to the
calls, and the weights of Linear/conv modules stored in bf16 or float16 once under autocast
(`knowledge/fx_patterns/fp16_weights.py`), each compiled with CUDA graphs (gpt2 with the causal SDPA rewrite,
sdpa_attention with QKV fusion). Each recipe gets the baseline's weights and is timed by free_recipes.median_ms
(the median of 100 CUDA-event timed calls after 10 warm-up calls, a CUDA-graph step marked before each). `max_rel` is
validate's metric, max |out - ref| / (|ref| + rms(ref)) against float32 eager: the reduced tier passes at 1e-2.
Exploratory: `operator-profiler bench` gives the speedups with intervals that the reports state.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "knowledge" / "fx_patterns"))
from cuda_graphs import clone_outputs  # noqa: E402
from fp16_weights import cast_matmul_weights, with_autocast  # noqa: E402
from free_recipes import autocast, median_ms  # noqa: E402
from qkv_fusion import fuse_parallel_linears  # noqa: E402
from sdpa_substitution import substitute_sdpa  # noqa: E402
from tf32_scoped import with_tf32  # noqa: E402

EXAMPLES = ("mlp_activations", "sdpa_attention", "embedding_projection", "gpt2")


def max_rel(fn: Callable[..., Any], reference: torch.Tensor, inputs: tuple[Any, ...]) -> tuple[float, bool]:
    """Validate's error metric against the float32 reference, and whether every value is finite."""
    with torch.no_grad():
        torch.compiler.cudagraph_mark_step_begin()
        out = fn(*inputs).double()
    ref = reference.double()
    rel = (out - ref).abs() / (ref.abs() + ref.pow(2).mean().sqrt())
    return float(rel.max()), bool(torch.isfinite(out).all())


def graph_only(fx_pass: Callable[[torch.fx.GraphModule], Any]) -> Callable[..., Any]:
    """An FX pass that needs the graph only, as `backend` calls passes: with the backend's example inputs too."""
    return lambda gm, _example_inputs: fx_pass(gm)


def backend(passes: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    """Inductor with CUDA graphs and cloned outputs, after FX passes called with the graph and the backend's
    example inputs (the causal SDPA rewrite checks the mask buffer's values in them; free_recipes.backend's
    passes see the graph only)."""
    from torch._inductor.compile_fx import compile_fx

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        for fx_pass in passes:
            fx_pass(gm, example_inputs)
        gm.recompile()
        return clone_outputs(compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True}))

    return compile_graph


def recipes(passes: tuple[Callable[..., Any], ...]) -> dict[str, Callable[[nn.Module], Any]]:
    """Label -> how to build the callable from a fresh model holding the baseline's weights."""
    bf16, fp16 = torch.bfloat16, torch.float16
    return {
        "eager": lambda m: m,
        "reduce-overhead": lambda m: torch.compile(m, mode="reduce-overhead"),
        "reduce-overhead + bf16 autocast (free)": lambda m: autocast(torch.compile(m, mode="reduce-overhead")),
        "reduce-overhead + fp16 autocast": lambda m: autocast(torch.compile(m, mode="reduce-overhead"), fp16),
        "tf32_scoped + passes + CUDA graphs": lambda m: with_tf32(torch.compile(m, backend=backend(passes))),
        "bf16 weights once + autocast + passes + CUDA graphs": lambda m: with_autocast(
            torch.compile(cast_matmul_weights(m, bf16), backend=backend(passes)), bf16),
        "fp16_weights + passes + CUDA graphs":
            lambda m: with_autocast(torch.compile(cast_matmul_weights(m), backend=backend(passes))),
    }


def own_workloads() -> dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]]:
    """A pre-LN transformer encoder (6 layers, d_model 768, batch 8 x 256) and a 6-conv CNN (batch 32, 128x128)."""

    def transformer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        layer = nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True, norm_first=True, dropout=0.0)
        return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False), (torch.randn(8, 256, 768),)

    def cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        def block(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))

        layers = [block(3, 64), block(64, 128), block(128, 256), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        return nn.Sequential(*layers, nn.Linear(256, 100)), (torch.randn(32, 3, 128, 128),)

    def on_gpu(build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]) -> Any:
        def built() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
            model, inputs = build()
            return model.cuda().eval(), tuple(x.cuda() for x in inputs)
        return built

    return {"own_transformer": on_gpu(transformer), "own_cnn": on_gpu(cnn)}


def measure(name: str, build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]],
            passes: tuple[Callable[..., Any], ...] = ()) -> dict[str, Any]:
    """Every recipe of `recipes` on one workload: time, error, finiteness, build time."""
    torch.manual_seed(0)
    model, inputs = build()
    with torch.no_grad():
        reference = model(*inputs).float()
    rows: dict[str, Any] = {}
    for label, make in recipes(passes).items():
        torch._dynamo.reset()
        started = time.time()
        try:
            torch.manual_seed(0)
            fresh, _ = build()
            fresh.load_state_dict(model.state_dict())
            fn = make(fresh)
            ms = median_ms(fn, inputs)
            error, finite = max_rel(fn, reference, inputs)
            rows[label] = {"ms": round(ms, 4), "max_rel": float(f"{error:.2e}"), "finite": finite,
                           "build_s": round(time.time() - started, 1)}
        except Exception as exc:  # noqa: BLE001 - a recipe that does not build is a result too
            rows[label] = {"error": repr(exc)[:300]}
        print(name, label, rows[label], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("examples", nargs="*", default=list(EXAMPLES))
    parser.add_argument("--own", action="store_true", help="also a transformer encoder and a CNN not in examples/")
    parser.add_argument("--out", type=Path, default=Path("reduced_tier_candidates.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name in args.examples:
        sys.path.insert(0, str(REPO / "examples" / name))
        module = importlib.import_module(name)
        passes = {"gpt2": (substitute_sdpa,), "sdpa_attention": (graph_only(fuse_parallel_linears),)}.get(name, ())
        results[name] = measure(name, module.get_model_and_input, passes)
    if args.own:
        for name, build in own_workloads().items():
            results[name] = measure(name, build)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
