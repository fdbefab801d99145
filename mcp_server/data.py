"""The package's data folders: `knowledge/` (rules, devices, stalls, FX patterns) and `prompts/` (templates).

In a checkout or an editable install they sit at the repository's root, beside `mcp_server/` (the plugin's own
layout); a wheel ships them inside the package as `mcp_server/knowledge/` and `mcp_server/prompts/`
(pyproject.toml maps them there). `OPERATOR_PROFILER_KNOWLEDGE` points to another knowledge folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from mcp_server.errors import ProfileFormatError

PACKAGE = Path(__file__).resolve().parent
KNOWLEDGE_ENV = "OPERATOR_PROFILER_KNOWLEDGE"


def data_dir(name: Literal["knowledge", "prompts"]) -> Path:
    """The installed package's data folder `name`, else the checkout's (or $OPERATOR_PROFILER_KNOWLEDGE)."""
    override = os.environ.get(KNOWLEDGE_ENV) if name == "knowledge" else None
    if override:
        return Path(override)
    for candidate in (PACKAGE / name, PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise ProfileFormatError(
        f"the package's {name}/ folder is missing (looked in {PACKAGE} and {PACKAGE.parent})",
        "reinstall operator-profiler (`pip install operator-profiler`, or `pip install -e .` in a checkout)",
    )
