"""A workload whose forward launches from two host threads, each on its own CUDA stream (GPU only)."""

import threading

import torch
from torch import nn


class TwoThreads(nn.Module):
    """Two branches of ten layers, each run by its own host thread on its own stream."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(512, 512)
        self.b = nn.Linear(512, 512)
        self.streams: list[torch.cuda.Stream] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.streams:
            self.streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        out: list[torch.Tensor | None] = [None, None]

        def branch(i: int, layer: nn.Linear) -> None:
            stream = self.streams[i]
            stream.wait_stream(torch.cuda.default_stream())
            with torch.cuda.stream(stream):
                y = x
                for _ in range(10):
                    y = torch.relu(layer(y)) if i == 0 else torch.sigmoid(layer(y)) * 0.5
                out[i] = y

        threads = [threading.Thread(target=branch, args=(i, layer)) for i, layer in enumerate((self.a, self.b))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for stream in self.streams:
            torch.cuda.current_stream().wait_stream(stream)
        return out[0] + out[1]


def get_model_and_input() -> tuple[nn.Module, torch.Tensor]:
    return TwoThreads().cuda(), torch.randn(256, 512, device="cuda")
