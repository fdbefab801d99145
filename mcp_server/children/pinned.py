"""Pinned host memory under ncu's kernel replay (torch only, imported by the harness).

Before each replay pass of a kernel, ncu restores the memory the kernel may have written, and pinned host memory is
memory every kernel can reach (mapped into the GPU's address space): each MiB pinned costs every replayed kernel
about 1.4 ms on an H200 (`benchmarks/ncu_pass_cost.py --pinned-mib`: 0.31 s per kernel, 0.53 s holding 150 MiB,
1.16 s holding 600 MiB). A DataLoader with `pin_memory=True` keeps its prefetched batches pinned, so a training
script's counter pass replayed each kernel in 0.61 s instead of 0.39 s. In the counter passes its batches stay
pageable (`PageableBatches`): their host-to-device copies then run synchronously there, which no kernel's counters
see; the timeline's pass, whose copies the profile reports, keeps them pinned as the workload asks. The counter
passes leave pageable the activations a training step offloads to the host too
(`torch.autograd.graph.save_on_cpu(pin_memory=True)`): pinned, hundreds of MiB through the step, they stopped an H200
counter pass at its replay budget with 48 % of the kernel time unreplayed.
"""

from __future__ import annotations

from typing import Any

from mcp_server.children.contract import BATCHES_ASKED, OFFLOAD_ASKED, PAGEABLE_LINE


class PageableBatches:
    """DataLoader batches left pageable: `torch.utils.data`'s pinning (its pin-memory thread's, and a loader's
    without workers) returns each batch as it is, counted in `batches`; and activations offloaded by `save_on_cpu`,
    whose contexts asking for pinned memory are counted in `offloads`."""

    def __init__(self) -> None:
        self.batches = 0
        self.offloads = 0
        self._original: Any = None
        self._offload_init: Any = None

    def install(self) -> PageableBatches:
        """Replace the loaders' pinning (both look it up in its module at each batch)."""
        from torch.utils.data._utils import pin_memory as pinning

        self._original = pinning.pin_memory

        def unpinned(data: Any, device: Any = None) -> Any:
            if self.batches == 0:
                print(f"{PAGEABLE_LINE}{BATCHES_ASKED}", flush=True)
            self.batches += 1
            return data

        pinning.pin_memory = unpinned
        self._unpin_offloads()
        return self

    def _unpin_offloads(self) -> None:
        """`save_on_cpu` contexts made from now on offload to pageable memory (its other arguments passed on)."""
        import inspect

        from torch.autograd.graph import save_on_cpu

        original = self._offload_init = save_on_cpu.__init__
        signature = inspect.signature(original)

        def init(*args: Any, **kwargs: Any) -> None:
            bound = signature.bind(*args, **kwargs)
            if bound.arguments.get("pin_memory"):
                if self.offloads == 0:
                    print(f"{PAGEABLE_LINE}{OFFLOAD_ASKED}", flush=True)
                self.offloads += 1
                bound.arguments["pin_memory"] = False
            original(*bound.args, **bound.kwargs)

        save_on_cpu.__init__ = init

    def remove(self) -> None:
        """Give the loaders and `save_on_cpu` their pinning back."""
        if self._original is not None:
            from torch.utils.data._utils import pin_memory as pinning

            pinning.pin_memory = self._original
            self._original = None
        if self._offload_init is not None:
            from torch.autograd.graph import save_on_cpu

            save_on_cpu.__init__ = self._offload_init
            self._offload_init = None


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
