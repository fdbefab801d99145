"""A plain training script that keeps its largest layer on the host: a language model whose token embedding (too
big for the GPU, as the story goes) lives in CPU memory and is updated there by its own Adam, while the transformer
runs on the GPU. Every step copies the embedded batch to the GPU and its gradient back through autograd. argparse
and the `__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/cpu_offload_train.py

`--embedding-on-gpu` keeps the embedding and its Adam on the GPU instead (what the analysis's `host_compute` change
asks for); `--time` prints the median step time (the GPU synchronised after each step, the first five left out).

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn
from torch.nn import functional as F

SIZES = {"gpu": {"vocab": 65536, "width": 512, "heads": 8, "depth": 4, "seq": 256, "batch": 16},
         "small": {"vocab": 64, "width": 16, "heads": 2, "depth": 1, "seq": 8, "batch": 2}}


class Body(nn.Module):
    """Transformer encoder layers and a tied-free output projection, on the GPU."""

    def __init__(self, width: int, heads: int, depth: int, vocab: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.out = nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.out(self.layers(x, mask=mask, is_causal=True))


def main() -> None:
    """Train for the given steps and print the last loss."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--embedding-on-gpu", action="store_true")
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    host = device if args.embedding_on_gpu else "cpu"  # where the embedding and its Adam live
    embedding = nn.Embedding(sizes["vocab"], sizes["width"]).to(host)
    body = Body(sizes["width"], sizes["heads"], sizes["depth"], sizes["vocab"]).to(device)
    host_opt = torch.optim.Adam(embedding.parameters(), lr=1e-3)
    gpu_opt = torch.optim.AdamW(body.parameters(), lr=1e-3)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        tokens = torch.randint(0, sizes["vocab"], (sizes["batch"], sizes["seq"] + 1), device=host)
        x = embedding(tokens[:, :-1]).to(device, non_blocking=True)
        logits = body(x)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten().to(device))
        host_opt.zero_grad(set_to_none=True)
        gpu_opt.zero_grad(set_to_none=True)
        loss.backward()
        host_opt.step()
        gpu_opt.step()
        if args.time:
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    print(f"loss {loss.item():.3f}")
    if args.time:
        print(f"step {1e3 * statistics.median(times[5:]):.2f} ms (median of {len(times) - 5}, embedding on "
              f"{'the GPU' if args.embedding_on_gpu else 'the host'})")


if __name__ == "__main__":
    main()
