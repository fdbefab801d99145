"""Launches from threads other than the measure range's: how many of the kernels left unattributed came from one
(a thread of the workload's own with no operator range open; autograd's backward thread launches inside its ranges
and is attributed)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from mcp_server.assemble.attribute import KernelLike
from mcp_server.schema.profile import KernelRecord

K = TypeVar("K", bound=KernelLike)


class OtherThreads:
    """The launches of threads other than the measure range's, noted as the kernels stream past, to say how many
    of those left unattributed came from such a thread (a thread of the workload's own with no operator range open;
    autograd's backward thread launches inside its ranges and is attributed)."""

    def __init__(self, measure_threads: list[int]) -> None:
        self.measure_threads = set(measure_threads)
        self.ordinals: set[int] = set()

    def watch(self, kernels: Iterable[K]) -> Iterator[K]:
        """`kernels`, unchanged, noting the ordinals launched from another thread."""
        for kernel in kernels:
            thread = kernel.launch_thread
            if self.measure_threads and thread is not None and thread not in self.measure_threads:
                self.ordinals.add(kernel.ordinal)
            yield kernel

    def warnings(self, unattributed: list[KernelRecord]) -> list[str]:
        """One line when some of `unattributed` were launched from another thread."""
        count = sum(1 for record in unattributed if record.kernel_id in self.ordinals)
        if not count:
            return []
        return [f"{count} unattributed kernel(s) were launched from a thread other than the measure range's, in no "
                "operator range (a thread of the workload's own): nothing names their operator"]
