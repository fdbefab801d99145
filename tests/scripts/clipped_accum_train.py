"""A plain training loop with gradient accumulation and clipping: each step loads `--accum` micro-batches (stacked
on the host, outside the model), runs forward and backward on each, clips the gradients' norm and steps SGD.
`--zero-first` zeroes the gradients in place after loading the step's first micro-batch, not after the step.

    operator-profiler profile --script clipped_accum_train.py --steps 2:3
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--zero-first", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(args.steps):
        for micro in range(args.accum):
            batch = torch.stack([torch.randn(8) for _ in range(4)])
            if args.zero_first and micro == 0:
                opt.zero_grad(set_to_none=False)
            loss = model(batch).pow(2).mean() / args.accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        opt.step()
        if not args.zero_first:
            opt.zero_grad()


if __name__ == "__main__":
    main()
