"""The tables the analysis reads: knowledge/*.yaml (thresholds, stalls, devices) and patterns.yaml beside it.

Thresholds and name patterns live in YAML, never in code. `knowledge/` is package data (`mcp_server.data`);
OPERATOR_PROFILER_KNOWLEDGE points to another folder.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mcp_server.data import KNOWLEDGE_ENV, data_dir
from mcp_server.errors import ProfilerError

PATTERNS_FILE = Path(__file__).with_name("patterns.yaml")


class KnowledgeError(ProfilerError):
    """A knowledge table is missing or malformed."""


def knowledge_dir() -> Path:
    """Folder holding devices.yaml, bottleneck_rules.yaml and warp_stalls.yaml."""
    return data_dir("knowledge")


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise KnowledgeError(
            f"knowledge table not found: {path}",
            f"reinstall operator-profiler, or set {KNOWLEDGE_ENV} to the folder holding it",
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise KnowledgeError(f"{path} is not valid YAML ({exc})", "fix the file (see git history)") from exc
    if not isinstance(data, dict):
        raise KnowledgeError(f"{path} does not hold a mapping", "fix the file (see git history)")
    return data


@lru_cache(maxsize=8)
def knowledge(name: str) -> dict[str, Any]:
    """knowledge/<name>.yaml as a dict (cached)."""
    return _load(knowledge_dir() / f"{name}.yaml")


def rules() -> dict[str, Any]:
    """knowledge/bottleneck_rules.yaml."""
    return knowledge("bottleneck_rules")


def rule(section: str, key: str) -> float:
    """One threshold, e.g. rule('launch', 'tiny_kernel_ns'); a missing one is a KnowledgeError."""
    try:
        return float(rules()[section][key])
    except (KeyError, TypeError) as exc:
        raise KnowledgeError(
            f"knowledge/bottleneck_rules.yaml has no {section}.{key}", "restore the threshold in that file"
        ) from exc


@lru_cache(maxsize=1)
def patterns() -> dict[str, Any]:
    """mcp_server/analysis/patterns.yaml."""
    return _load(PATTERNS_FILE)


@lru_cache(maxsize=64)
def _compiled(key: str) -> tuple[re.Pattern[str], ...]:
    values = patterns().get(key)
    if not isinstance(values, list):
        raise KnowledgeError(f"{PATTERNS_FILE} has no list {key!r}", "restore it in that file")
    return tuple(re.compile(v, re.IGNORECASE) for v in values)


def matches(key: str, text: str | None) -> bool:
    """True when `text` matches any pattern of patterns.yaml[key]."""
    if not text:
        return False
    return any(p.search(text) for p in _compiled(key))
