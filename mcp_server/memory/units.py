"""Bytes as people read them."""

from __future__ import annotations

GIB = 1024 ** 3


def size(n: float) -> str:
    """Bytes for people: 1.25 GiB, 512.00 MiB, 3.00 KiB, 12 B."""
    for unit, scale in (("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
