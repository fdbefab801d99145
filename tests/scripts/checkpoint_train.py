"""A plain training script whose blocks use activation checkpointing (`torch.utils.checkpoint`, non-reentrant): their
forward runs again inside the backward, and stops early by raising inside the modules it re-runs; the gradients are
clipped between the backward and the optimizer's step. `--reentrant` checkpoints the blocks after the first the old
way (`use_reentrant=True`): their forward runs under no_grad, and the backward node runs it again and then a backward
through it.

    operator-profiler profile --script checkpoint_train.py
"""

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)  # NORM_LINE
        return x + self.ff(h)  # FF_LINE


class Net(nn.Module):
    def __init__(self, width: int = 32, depth: int = 3, reentrant: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reentrant:  # its input must require grad: the first block is not checkpointed
            x = self.blocks[0](x)
            for block in self.blocks[1:]:
                x = checkpoint(block, x, use_reentrant=True)
            return self.head(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--reentrant", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = Net(reentrant=args.reentrant).to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(args.steps):
        loss = model(torch.randn(16, 32, device=device)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


if __name__ == "__main__":
    main()
