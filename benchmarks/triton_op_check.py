"""The `topk_softmax` Triton op (knowledge/fx_patterns/triton_op.py) on this GPU, against the chain it replaces.

    python benchmarks/triton_op_check.py --out DIR

For each router shape (tokens, experts, k): the op's indices and weights against the plain-torch chain (softmax,
top-k, renormalisation) in float32, and the time per call of the chain eager, the chain compiled by Inductor
(`torch.compile`, which calls aten's top-k between two kernels it generates) and the op, each by
`torch.utils.benchmark.Timer.blocked_autorange` (an independent timer) with its min run time. Writes
DIR/triton_op_check.json and prints a table. Then the op as a library op on the GPU: `torch.library.opcheck` on CUDA
tensors, and its gradient (eager, and compiled with `mode="reduce-overhead"`) against the chain's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "knowledge" / "fx_patterns"))
from triton_op import apply, reference_topk_softmax  # noqa: E402

SHAPES = ((512, 16, 2), (4096, 8, 2), (16384, 64, 6), (65536, 128, 8), (8192, 256, 8), (1024, 1000, 4))


def _time_us(fn: object, logits: torch.Tensor, k: int) -> float:
    """Median microseconds per call of fn(logits, k), synchronised by the Timer around each block of calls."""
    return Timer("fn(x, k)", globals={"fn": fn, "x": logits, "k": k}).blocked_autorange(min_run_time=1.0).median * 1e6


def check(tokens: int, experts: int, k: int) -> dict[str, object]:
    """Agreement and times for one router shape."""
    torch.manual_seed(0)
    logits = torch.randn(tokens, experts, device="cuda")
    weights, index = apply(logits, k)
    ref_weights, ref_index = reference_topk_softmax(logits, k)
    compiled = torch.compile(reference_topk_softmax)
    compiled(logits, k)
    row = {"tokens": tokens, "experts": experts, "k": k,
           "same_indices": bool(torch.equal(index, ref_index)),
           "max_abs_weight_error": float((weights - ref_weights).abs().max()),
           "chain_eager_us": _time_us(reference_topk_softmax, logits, k),
           "chain_compiled_us": _time_us(compiled, logits, k),
           "op_us": _time_us(apply, logits, k)}
    row["op_vs_compiled"] = row["chain_compiled_us"] / row["op_us"]
    return row


def gradients() -> dict[str, object]:
    """opcheck on CUDA tensors, and the op's gradient against the chain's, eager and compiled with reduce-overhead."""
    torch.manual_seed(0)
    logits = torch.randn(2048, 64, device="cuda")
    checks = torch.library.opcheck(torch.ops.operator_profiler_patterns.topk_softmax, (logits, 6))
    scale = torch.arange(6.0, device="cuda")

    def loss(fn: object, x: torch.Tensor) -> torch.Tensor:
        weights, _ = fn(x, 6)  # type: ignore[operator]
        return (weights * scale).sum()

    def grad(fn: object, compiled: bool) -> torch.Tensor:
        x = logits.clone().requires_grad_(True)
        step = torch.compile(loss, mode="reduce-overhead") if compiled else loss
        for _ in range(3):  # warm-up, capture, replay
            x.grad = None
            step(fn, x).backward()
        return x.grad

    reference = grad(reference_topk_softmax, False)
    return {"opcheck": checks,
            "grad_max_abs_error_eager": float((grad(apply, False) - reference).abs().max()),
            "grad_max_abs_error_compiled": float((grad(apply, True) - reference).abs().max())}


def main() -> int:
    """Check every shape; write and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [check(*shape) for shape in SHAPES]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
              "gradients": gradients()}
    (args.out / "triton_op_check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'tokens':>7} {'E':>4} {'k':>2} {'same idx':>8} {'max err':>9} {'eager us':>9} {'compiled us':>11} "
          f"{'op us':>7} {'op vs compiled':>14}")
    for r in rows:
        print(f"{r['tokens']:>7} {r['experts']:>4} {r['k']:>2} {r['same_indices']!s:>8} "
              f"{r['max_abs_weight_error']:>9.2e} "
              f"{r['chain_eager_us']:>9.1f} {r['chain_compiled_us']:>11.1f} {r['op_us']:>7.1f} "
              f"{r['op_vs_compiled']:>13.2f}x")
    print(json.dumps(result["gradients"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
