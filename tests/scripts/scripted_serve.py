"""A plain serving script whose model is TorchScript (`torch.jit.script`), one `serve` call a batch."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).softmax(dim=-1)


def serve(model: torch.jit.ScriptModule, batch: torch.Tensor) -> list[int]:
    with torch.inference_mode():
        return model(batch).argmax(dim=1).tolist()


def main() -> None:
    torch.manual_seed(0)
    model = torch.jit.script(Net().eval())
    for _ in range(8):
        serve(model, torch.randn(4, 16))


if __name__ == "__main__":
    main()
