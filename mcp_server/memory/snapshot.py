"""Reading the caching allocator's snapshots (`torch.cuda.memory._snapshot()`, pickled) without torch.

A snapshot is plain data: `segments` (each cudaMalloc'd segment with its `blocks`), `device_traces` (per device,
the history's entries: `action` alloc / free_requested / free_completed / segment_alloc / segment_free /
segment_map / segment_unmap / snapshot / oom, `addr` (`device_free` for oom), `size`, `stream`, `time_us`,
`frames`), and `allocator_settings`. It is unpickled with an unpickler that refuses every class: a snapshot
holds only dicts, lists, tuples, strings and numbers, and a run directory may come from anywhere.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_server.errors import ProfileFormatError

LIVE = "active_allocated"
REMEDY = "re-run the memory pass (`operator-profiler memory WORKLOAD`)"


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a memory snapshot holds no objects of classes ({module}.{name})")


def load_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot pickled at `path`, or a ProfileFormatError saying why it is not one."""
    if not path.is_file():
        raise ProfileFormatError(f"memory snapshot not found: {path}", REMEDY)
    try:
        data = _PlainData(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, MemoryError) as exc:
        raise ProfileFormatError(f"{path} is not a memory snapshot: {exc}", REMEDY) from exc
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise ProfileFormatError(f"{path} is not a memory snapshot (no segments)", REMEDY)
    return data


@dataclass(frozen=True)
class LiveBlock:
    """A block handed out by the allocator at the snapshot's time."""

    address: int
    size: int
    requested_size: int
    stream: int
    frames: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SnapshotState:
    """What one device held at a snapshot: its allocated blocks and the bytes its segments reserve."""

    blocks: dict[int, LiveBlock]
    reserved_bytes: int
    expandable: bool


def device_state(snapshot: dict[str, Any], device: int) -> SnapshotState:
    """The allocated blocks (by address) and reserved bytes of `device` in `snapshot`."""
    blocks: dict[int, LiveBlock] = {}
    reserved = 0
    expandable = False
    for segment in snapshot.get("segments", []):
        if int(segment.get("device", 0)) != device:
            continue
        reserved += int(segment.get("total_size", 0))
        expandable = expandable or bool(segment.get("is_expandable"))
        address = int(segment.get("address", 0))
        for block in segment.get("blocks", []):
            start = int(block.get("address", address))
            size = int(block.get("size", 0))
            if block.get("state") == LIVE:
                blocks[start] = LiveBlock(start, size, int(block.get("requested_size", size)),
                                          int(segment.get("stream", 0)), list(block.get("frames") or []))
            address = start + size
    return SnapshotState(blocks, reserved, expandable)


def device_trace(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    """The history's entries of `device`, in the order the allocator recorded them."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    return [entry for entry in traces[device] if isinstance(entry, dict)]


def settings(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The allocator's settings at the snapshot (PYTORCH_CUDA_ALLOC_CONF, expandable_segments, ...)."""
    found = snapshot.get("allocator_settings")
    return found if isinstance(found, dict) else {}
