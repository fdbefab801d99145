"""A pass's share of the CPUs, as the run's passes run at once (torch only, imported by the harness).

Each pass is its own process, and torch gives every process one intra-op thread per core. On an H200's 16-core
host (docs/measurements/h200_unseen_workloads.json, `nineteenth_stop`), a DataLoader batch of 64 images of
3x128x128, collated and pinned, took about 5 ms in one process alone with torch's 16 threads and 1.1 s in each of
three processes at once; with 5 threads each, 6 ms. Inside a pass's measured window, the other passes waiting for
the GPU lock, the same batch took 0.5 s with 16 threads and 2.5 ms with 4. So a pass keeps to its share
(`--cpu-threads`) from its start to its end, its window included.
"""

from __future__ import annotations

from typing import Any


def hold_to_share(threads: int | None) -> dict[str, Any] | None:
    """Hold torch to `threads` intra-op threads when that is fewer than its own count; what was done, for the
    harness's result (None: nothing asked, or nothing to lower)."""
    if threads is None:
        return None
    import torch

    own = torch.get_num_threads()
    if threads >= own:
        return None
    torch.set_num_threads(threads)
    return {"own": own, "share": threads}
