"""Pinned host memory under ncu's kernel replay (torch only, imported by the harness).

Before each replay pass of a kernel, ncu restores the memory the kernel may have written, and pinned host memory is
memory every kernel can reach (mapped into the GPU's address space): each MiB pinned costs every replayed kernel
about 1.4 ms on an H200 (`benchmarks/ncu_pass_cost.py --pinned-mib`: 0.31 s per kernel, 0.53 s holding 150 MiB,
1.16 s holding 600 MiB). A DataLoader with `pin_memory=True` keeps its prefetched batches pinned, so a training
script's counter pass replayed each kernel in 0.61 s instead of 0.39 s. In the counter passes its batches stay
pageable (`PageableBatches`): their host-to-device copies then run synchronously there, which no kernel's counters
see; the timeline's pass, whose copies the profile reports, keeps them pinned as the workload asks.
"""

from __future__ import annotations

from typing import Any

from mcp_server.children.contract import PAGEABLE_LINE


class PageableBatches:
    """DataLoader batches left pageable: `torch.utils.data`'s pinning (its pin-memory thread's, and a loader's
    without workers) returns each batch as it is, counted in `batches`."""

    def __init__(self) -> None:
        self.batches = 0
        self._original: Any = None

    def install(self) -> PageableBatches:
        """Replace the loaders' pinning (both look it up in its module at each batch)."""
        from torch.utils.data._utils import pin_memory as pinning

        self._original = pinning.pin_memory

        def unpinned(data: Any, device: Any = None) -> Any:
            if self.batches == 0:
                print(f"{PAGEABLE_LINE}a DataLoader asked for pinned batches", flush=True)
            self.batches += 1
            return data

        pinning.pin_memory = unpinned
        return self

    def remove(self) -> None:
        """Give the loaders their pinning back."""
        if self._original is not None:
            from torch.utils.data._utils import pin_memory as pinning

            pinning.pin_memory = self._original
            self._original = None


def pinned_host_bytes() -> int | None:
    """Bytes of pinned host memory PyTorch's host allocator holds now (in use and cached); None where this torch
    does not count them or has no CUDA."""
    import torch

    stats = getattr(torch.cuda.memory, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_available():
        return None
    try:
        held = stats().get("allocated_bytes.current")
    except RuntimeError:
        return None
    return int(held) if held is not None else None
