"""A plain training script for a recurrent language model: embedding, a 2-layer GRU (cuDNN), a tied vocabulary head;
bfloat16 autocast, gradient clipping, AdamW, token batches from a DataLoader; argparse and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/gru_lm_train.py

`--graphed` replays the model's forward and backward from CUDA graphs (knowledge/fx_patterns/graphed_training.py;
autocast then runs with its cache off, as make_graphed_callables requires); `--time` prints the milliseconds per
step after the first third of the steps (CUDA-synchronised wall time), and the last loss.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GruLM(nn.Module):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab)."""

    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, num_layers=layers, batch_first=True, dropout=0.1)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(self.norm(hidden))


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--graphed", action="store_true", help="the model's forward and backward from CUDA graphs")
    parser.add_argument("--time", action="store_true", help="print ms per step after the first third of the steps")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GruLM(args.vocab, args.width, 2).to(device)
    tokens = torch.randint(0, args.vocab, (args.steps * args.batch_size, args.seq + 1))
    loader = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    model.train()
    forward = model
    if args.graphed:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "knowledge" / "fx_patterns"))
        from graphed_training import graph_training_module

        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
            forward = graph_training_module(model, (tokens[: args.batch_size, :-1].to(device),))
    timed_from, started = args.steps // 3, 0.0
    for step, (batch,) in enumerate(loader):
        if args.time and step == timed_from:
            _synchronize(device)
            started = time.perf_counter()
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=not args.graphed):
            logits = forward(batch[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if args.time:
        _synchronize(device)
        print(f"ms per step {1e3 * (time.perf_counter() - started) / (args.steps - timed_from):.3f}")
    print(f"last loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
