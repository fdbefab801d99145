"""Recorded real GPU artifacts: extract `tests/fixtures/<name>.tar.xz` once per test session."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def extract_fixture(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Extract `tests/fixtures/<name>.tar.xz` (once per session) and return the run folder it holds.

    Each archive holds one top-level folder (e.g. `conv_block_eager/` with `nsys/`, `ncu/`, `torch/` passes);
    that folder's path is returned. A second call with the same name reuses the extracted copy.
    """
    archive = FIXTURES / f"{name}.tar.xz"
    if not archive.is_file():
        raise FileNotFoundError(f"fixture archive not found: {archive}")
    target = tmp_path_factory.getbasetemp() / "fixtures" / name
    done = target / ".extracted"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "r:xz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(target, filter="data")
            else:  # Python without extraction filters (< 3.10.12 / 3.11.4): the archives are our own
                tar.extractall(target)
        done.touch()
    tops = [p for p in target.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise ValueError(f"{archive} should hold exactly one top-level folder, found {[p.name for p in tops]}")
    return tops[0]
