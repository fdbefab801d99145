"""Serves a small model as `torch.export` (`--trace export`) or `torch.fx.symbolic_trace` (`--trace fx`) hands it over:
a GraphModule whose generated code calls the operators itself."""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        return x + torch.relu(h)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x).mean(dim=1))


def serve(program: nn.Module, batch: torch.Tensor) -> list[int]:
    with torch.inference_mode():
        return program(batch).argmax(dim=1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", choices=("export", "fx"), default="export")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net().eval()
    batch = torch.randn(2, 4, 8)
    if args.trace == "export":
        program = torch.export.export(model, (batch,)).module()
    else:
        program = torch.fx.symbolic_trace(model)
    for _ in range(4):
        serve(program, batch)


if __name__ == "__main__":
    main()
