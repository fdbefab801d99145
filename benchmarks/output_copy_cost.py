"""What copying a CUDA-graph recipe's outputs costs per call: the reduce-overhead recipe of a workload, its outputs
returned as the replay left them, cloned one by one (as `optimize` writes a CUDA-graph winner: each replay overwrites
the previous outputs), or copied by one `torch._foreach_copy_`. GPU machine only; run each variant in its own process:

    python benchmarks/output_copy_cost.py scripts/gpu_workloads/multihead.py none|clone|foreach

Prints one JSON line: latency (CUDA events around one call, then a synchronisation; median of 200) and back-to-back
time per call (200 calls queued, one synchronisation; median of 5 blocks), in microseconds. The recipe is
reduce-overhead with the whole model and its floating-point inputs in float16, TF32 off.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

VARIANTS = ("none", "clone", "foreach")


def _copied(out: Any, variant: str) -> Any:
    """`out` as the replay left it, cloned tensor by tensor, or copied by one foreach call."""
    if variant == "clone":
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
    if variant == "foreach":
        leaves, spec = tree_flatten(out)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        copies = [torch.empty_like(t) for t in tensors]
        torch._foreach_copy_(copies, tensors)
        fresh = iter(copies)
        return tree_unflatten([next(fresh) if isinstance(t, torch.Tensor) else t for t in leaves], spec)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", type=Path, help="a .py file defining get_model_and_input()")
    parser.add_argument("variant", choices=VARIANTS)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location(args.workload.stem, args.workload)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model, inputs = module.get_model_and_input()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    model = model.to(torch.float16)
    inputs = tuple(x.to(torch.float16) if x.is_floating_point() else x for x in inputs)
    compiled = torch.compile(model, mode="reduce-overhead")

    def call() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return _copied(compiled(*inputs), args.variant)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.no_grad():
        for _ in range(30):
            call()
        torch.cuda.synchronize()
        latency = []
        for _ in range(200):
            start.record()
            call()
            end.record()
            end.synchronize()
            latency.append(start.elapsed_time(end) * 1e3)
        queued = []
        for _ in range(5):
            torch.cuda.synchronize()
            start.record()
            for _ in range(200):
                call()
            end.record()
            end.synchronize()
            queued.append(start.elapsed_time(end) * 1e3 / 200)
    print(json.dumps({"workload": args.workload.name, "variant": args.variant,
                      "latency_us": statistics.median(latency), "b2b_us": statistics.median(queued)}))


if __name__ == "__main__":
    main()
