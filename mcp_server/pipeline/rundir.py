"""The run directory: raw artifacts of every pass plus manifest.json; profile.json is derived from it."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from mcp_server.errors import ProfileFormatError, UsageError
from mcp_server.schema.io import write_model_atomic
from mcp_server.schema.manifest import RunManifest

MANIFEST = "manifest.json"
PROFILE = "profile.json"


def default_run_dir(workload: Path, root: Path | None = None, suffix: str | None = None) -> Path:
    """`./op_runs/<workload>[-suffix]-<YYYYmmdd-HHMMSS>[-N]`: a fresh directory per run, never shared."""
    base = (root or Path.cwd()) / "op_runs"
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", workload.stem) + (f"-{suffix}" if suffix else "")
    name = f"{stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    candidate, n = base / name, 1
    while candidate.exists():
        n += 1
        candidate = base / f"{name}-{n}"
    return candidate


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (or accept an empty/previous one) and check it can be written."""
    path = path.resolve()
    if path.exists() and not path.is_dir():
        raise UsageError(f"output path exists and is not a directory: {path}", "pass --output a directory path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"cannot write to output directory {path}: {exc.strerror or exc}",
            "pass --output a directory you can write to",
        ) from exc
    if not os.access(path, os.W_OK):
        raise UsageError(f"cannot write to output directory {path}", "pass --output a directory you can write to")
    return path


def write_manifest(run_dir: Path, manifest: RunManifest) -> None:
    """Atomically write manifest.json."""
    write_model_atomic(run_dir / MANIFEST, manifest)


def read_manifest(run_dir: Path) -> RunManifest:
    """Read and validate manifest.json of a run directory."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise ProfileFormatError(
            f"{run_dir} is not a run directory (no {MANIFEST})",
            "pass a directory written by `operator-profiler profile`",
        )
    try:
        return RunManifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ProfileFormatError(f"{path} is corrupt: {str(exc).splitlines()[0]}", "re-run the capture") from exc
