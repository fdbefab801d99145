"""A plain serving script whose requests are handled by a pool of worker threads: each worker takes a batch of
requests, runs a small image classifier on it under `torch.inference_mode()` on its own CUDA stream, and reads the
top-5 classes back to the host. The main thread submits the batches and waits for them (`serve`). argparse and the
`__main__` guard; nothing of Operator Profiler in it.

    operator-profiler run --script scripts/gpu_workloads/threaded_serve.py --window-fn serve --steps 1:1

`OPERATOR_PROFILER_EXAMPLE_SCALE=small` shrinks it for a CPU machine.
"""

from __future__ import annotations

import argparse
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

SIZES = {"gpu": {"width": 64, "image": 128, "batch": 16, "classes": 1000},
         "small": {"width": 4, "image": 16, "batch": 2, "classes": 10}}


class Classifier(nn.Module):
    """Images (n, 3, h, w) -> class logits: three conv stages and a linear head."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        channels = 3
        for scale in (1, 2, 4):
            stages += [nn.Conv2d(channels, width * scale, 3, stride=2, padding=1), nn.BatchNorm2d(width * scale),
                       nn.ReLU()]
            channels = width * scale
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images).mean(dim=(2, 3)))


class Worker:
    """A request handler: the shared model, one CUDA stream per thread."""

    def __init__(self, model: nn.Module, device: str) -> None:
        self.model, self.device = model, device
        self.local = threading.local()

    def handle(self, images: torch.Tensor) -> list[list[int]]:
        """Classify one batch; the top-5 classes of each image."""
        stream = getattr(self.local, "stream", None)
        if stream is None and self.device == "cuda":
            stream = self.local.stream = torch.cuda.Stream()
        with torch.inference_mode(), torch.cuda.stream(stream) if stream is not None else _nothing():
            logits = self.model(images.to(self.device, non_blocking=True))
            top = logits.topk(5 if logits.shape[1] >= 5 else 1, dim=1).indices
        return top.cpu().tolist()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def serve(pool: ThreadPoolExecutor, worker: Worker, batches: list[torch.Tensor]) -> int:
    """Hand every batch to the pool and wait for all of them: the number of images answered."""
    return sum(len(answer) for answer in pool.map(worker.handle, batches))


def main() -> None:
    """Serve `--rounds` rounds of `--batches` batches each with `--workers` threads."""
    sizes = SIZES["small" if os.environ.get("OPERATOR_PROFILER_EXAMPLE_SCALE") == "small" else "gpu"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=4, help="batches a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Classifier(sizes["width"], sizes["classes"]).to(device).eval()
    batches = [torch.randn(sizes["batch"], 3, sizes["image"], sizes["image"]).pin_memory() if device == "cuda"
               else torch.randn(sizes["batch"], 3, sizes["image"], sizes["image"]) for _ in range(args.batches)]
    worker = Worker(model, device)
    with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="serve") as pool:
        for round_ in range(args.rounds):
            print(f"round {round_}: {serve(pool, worker, batches)} images")


if __name__ == "__main__":
    main()
