"""A plain training script that saves device memory the ways PyTorch's tutorials teach: the forward's saved
activations offloaded to pinned host memory (`torch.autograd.graph.save_on_cpu(pin_memory=True)`, copied back in the
backward), every gradient clipped by a tensor hook (`register_hook`), and the optimizer step fused into the backward
pass (one AdamW per parameter, stepped from a `register_post_accumulate_grad_hook`, so no `optimizer.step()` is ever
called). The model is a small pre-norm transformer language model. argparse, a DataLoader and the `__main__` guard;
nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/offload_hooks_train.py --window-fn backward --steps 2:1

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SIZES = {"gpu": {"vocab": 8192, "width": 768, "heads": 12, "blocks": 4, "tokens": 256, "batch": 8, "examples": 64},
         "small": {"vocab": 64, "width": 16, "heads": 2, "blocks": 2, "tokens": 8, "batch": 2, "examples": 8}}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP, each added to its input."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    """Token ids (n, t) -> next-token logits (n, t, vocab)."""

    def __init__(self, sizes: dict[str, int]) -> None:
        super().__init__()
        self.embed = nn.Embedding(sizes["vocab"], sizes["width"])
        self.blocks = nn.ModuleList(Block(sizes["width"], sizes["heads"]) for _ in range(sizes["blocks"]))
        self.norm = nn.LayerNorm(sizes["width"])
        self.head = nn.Linear(sizes["width"], sizes["vocab"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), diagonal=1)
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def fuse_optimizer_into_backward(model: nn.Module, lr: float, clip: float) -> None:
    """Clip each gradient by value as it is computed, and step its parameter's own AdamW as soon as the gradient has
    been accumulated (then free it)."""
    optimizers = {p: torch.optim.AdamW([p], lr=lr, foreach=False) for p in model.parameters()}

    def step(parameter: torch.Tensor) -> None:
        optimizers[parameter].step()
        optimizers[parameter].zero_grad(set_to_none=True)

    for parameter in model.parameters():
        parameter.register_hook(lambda grad: grad.clamp(-clip, clip))
        parameter.register_post_accumulate_grad_hook(step)


def main() -> None:
    """Train `--epochs` epochs of next-token prediction."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--clip", type=float, default=1.0)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = LanguageModel(sizes).to(device)
    fuse_optimizer_into_backward(model, args.lr, args.clip)
    tokens = torch.randint(0, sizes["vocab"], (sizes["examples"], sizes["tokens"] + 1))
    loader = DataLoader(TensorDataset(tokens), batch_size=sizes["batch"], shuffle=True, drop_last=True,
                        pin_memory=device == "cuda")
    for epoch in range(args.epochs):
        for (batch,) in loader:
            batch = batch.to(device, non_blocking=True)
            with torch.autograd.graph.save_on_cpu(pin_memory=device == "cuda"):
                logits = model(batch[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
