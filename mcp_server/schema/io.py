"""Loading and atomically writing the JSON files the tool produces."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from mcp_server.errors import ProfileFormatError
from mcp_server.schema.profile import SCHEMA_VERSION, OperatorAttributedProfile


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Atomically write `data` as indented JSON."""
    write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def write_model_atomic(path: Path, model: BaseModel) -> None:
    """Atomically write a pydantic model as JSON."""
    write_text_atomic(path, model.model_dump_json(indent=1) + "\n")


def write_model_streaming(path: Path, model: BaseModel, fields: Sequence[str], chunk: int = 256) -> None:
    """Atomically write a pydantic model as `write_model_atomic` does, byte for byte, without ever holding its JSON.

    The top-level list fields named in `fields` (e.g. a profile's million kernels) are serialised `chunk` items
    at a time, indented as they sit in the whole document, and written as they come.
    """
    path = Path(path)
    skeleton = model.model_copy(update={name: [] for name in fields}).model_dump_json(indent=1) + "\n"
    newline = os.linesep.encode()
    pieces: list[tuple[int, str]] = []
    for name in fields:
        marker = f'\n "{name}": []'
        at = skeleton.find(marker)  # a top-level key: nested keys sit deeper, strings hold no raw newline
        if at < 0 or skeleton.find(marker, at + 1) >= 0:
            raise ValueError(f"{type(model).__name__}.{name} is not a top-level list field")
        pieces.append((at + len(marker) - 1, name))
    pieces.sort()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:

            def write(data: bytes) -> None:
                handle.write(data if newline == b"\n" else data.replace(b"\n", newline))

            done = 0
            for at, name in pieces:  # `at` is the `]` of the field's empty list in the skeleton
                write(skeleton[done:at].encode("utf-8"))
                done = at
                items = getattr(model, name)
                if not items:
                    continue
                # Each chunk as the value of the same key in a one-key object: its items come out indented as
                # in the whole document, between `{\n "name": [` and `\n ]\n}`.
                item_list = type(model).model_fields[name].annotation
                adapter = TypeAdapter(dict[str, item_list])  # type: ignore[valid-type]
                head = len(f'{{\n "{name}": ['.encode())
                for first in range(0, len(items), chunk):
                    body = adapter.dump_json({name: items[first : first + chunk]}, indent=1)[head:-5]
                    write(body if first == 0 else b"," + body)
                write(b"\n ")
            write(skeleton[done:].encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _major(version: str) -> str:
    return str(version).split(".", 1)[0]


def load_profile(path: Path) -> OperatorAttributedProfile:
    """Read and validate a profile.json; a corrupt file or another major schema version is an error."""
    path = Path(path)
    if not path.is_file():
        raise ProfileFormatError(f"profile not found: {path}", "pass the profile.json a `profile` run wrote")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileFormatError(
            f"{path} is not valid JSON ({exc})", "re-create it with `operator-profiler assemble RUN_DIR`"
        ) from exc
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ProfileFormatError(f"{path} has no schema_version: not an OperatorAttributedProfile",
                                 "pass a profile.json written by operator-profiler")
    found = str(data["schema_version"])
    if _major(found) != _major(SCHEMA_VERSION):
        raise ProfileFormatError(
            f"{path} has schema version {found}; this operator-profiler reads {_major(SCHEMA_VERSION)}.x",
            "re-assemble it from its run directory with this version (`operator-profiler assemble RUN_DIR`)",
        )
    try:
        return OperatorAttributedProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProfileFormatError(
            f"{path} is not a valid profile: {where}: {first['msg']} ({exc.error_count()} errors)",
            "re-create it with `operator-profiler assemble RUN_DIR`",
        ) from exc
