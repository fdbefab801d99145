"""An inference script whose step function shares its name with one of the standard library's: `os.environ` calls an
`encode` of its own as the script reads its environment, before the script's `encode` first runs.

    operator-profiler profile --script encode_serve.py --window-fn encode --steps 2:2
"""

import os

import torch
from torch import nn


@torch.inference_mode()
def encode(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).mean(dim=0)


def main() -> None:
    width = int(os.environ.get("ENCODE_SERVE_WIDTH", "8"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    for _ in range(6):
        encode(model, torch.randn(4, width))


if __name__ == "__main__":
    main()
