"""Which CUDA API calls are events of a window (cuda_api.yaml beside this module): the host synchronisations, memory
copies and sets every timeline adapter reads among its runtime calls."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mcp_server.schema.records import RuntimeKind

API_FILE = Path(__file__).with_name("cuda_api.yaml")


@lru_cache(maxsize=1)
def _names() -> dict[str, Any]:
    return yaml.safe_load(API_FILE.read_text(encoding="utf-8"))


def kind_of(api: str) -> RuntimeKind | None:
    """What a call of `api` (its bare name) is to the window: a copy, a set, a synchronisation, or none of those."""
    names = _names()
    return ("memcpy" if api in names["copies"] else "memset" if api in names["sets"]
            else "sync" if api in names["synchronizing"] else None)


def synchronizing(api: str, copy_kind: str | None, src: str | None, dst: str | None) -> bool:
    """Whether the host waits in the call: a synchronising API, or a copy from the device into pageable host memory
    (CUDA returns from such a copy, asynchronous or not, only once it is done)."""
    return api in _names()["synchronizing"] or (copy_kind == "DtoH" and dst == "pageable" and src in ("device", None))
