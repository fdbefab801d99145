"""Requests handled by a pool of two worker threads, started in the warm-up's first call: each worker runs the
shared model on one batch and reads its answer back; `serve` hands every batch to the pool and waits.

    operator-profiler profile --script pooled_serve.py --window-fn serve --steps 1:1
"""

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


def handle(model: nn.Module, batch: torch.Tensor) -> list[int]:
    with torch.inference_mode():
        scores = model(batch)
    return scores.argmax(dim=1).tolist()


def serve(pool: ThreadPoolExecutor, model: nn.Module, batches: list[torch.Tensor]) -> int:
    return sum(len(answer) for answer in pool.map(lambda batch: handle(model, batch), batches))


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    batches = [torch.randn(4, 8) for _ in range(4)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(3):
            serve(pool, model, batches)


if __name__ == "__main__":
    main()
