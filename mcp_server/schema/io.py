"""Loading and atomically writing the JSON files the tool produces."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from mcp_server.errors import ProfileFormatError
from mcp_server.schema.profile import SCHEMA_VERSION, OperatorAttributedProfile

M = TypeVar("M", bound=BaseModel)


def read_text(path: Path, what: str, remedy: str) -> str:
    """A text file the user named, or a ProfileFormatError saying what is wrong with it: missing, a folder,
    unreadable, not UTF-8 text."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ProfileFormatError(f"{what} not found: {path}", remedy)
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileFormatError(f"{path} is not a {what}: not UTF-8 text", remedy) from exc
    except OSError as exc:
        raise ProfileFormatError(f"cannot read {what} {_shown(path)}: {exc.strerror or exc}",
                                 "check the path and its permissions") from exc


def read_json(path: Path, what: str, remedy: str) -> Any:
    """A JSON file's content, or a ProfileFormatError (as `read_text`, or not JSON, or nested too deep)."""
    text = read_text(path, what, remedy)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileFormatError(f"{path} is not valid JSON ({exc})", remedy) from exc
    except RecursionError as exc:
        raise ProfileFormatError(f"{path} nests too deeply to be a {what}", remedy) from exc


def read_model(path: Path, model: type[M], what: str, remedy: str) -> M:
    """A JSON file validated as `model`, or a ProfileFormatError naming the first fields that are wrong."""
    text = read_text(path, what, remedy)
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise ProfileFormatError(f"{path} is not a valid {what}: {format_errors(exc, 3)}", remedy) from exc
    except RecursionError as exc:
        raise ProfileFormatError(f"{path} nests too deeply to be a {what}", remedy) from exc


def format_errors(exc: ValidationError, limit: int = 8) -> str:
    """The first validation errors as 'field.path: message' joined by '; '."""
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()[:limit]]
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _shown(path: Path, limit: int = 200) -> str:
    text = str(path)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _current_umask()  # read once, at import: os.umask can only be read by setting it


def _named(exc: OSError, path: Path) -> OSError:
    """An error of a write to `path` that names the file (a write or rename error carries no file name)."""
    return exc if exc.filename is not None else OSError(exc.errno, exc.strerror, str(path))


def _temporary(path: Path) -> tuple[int, str]:
    """A temporary file beside `path`, with the permissions a plain open() would give it (not mkstemp's 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~UMASK)
    return fd, tmp


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for a writer that takes a file name (e.g. a chart library); renamed to
    `path` when the block ends, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary(path)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from exc
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
    fd, tmp = _temporary(path)
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
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _named(exc, path) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _major(version: str) -> str:
    return str(version).split(".", 1)[0]


def load_profile(path: Path) -> OperatorAttributedProfile:
    """Read and validate a profile.json; a corrupt file or another major schema version is an error."""
    path = Path(path)
    data = read_json(path, "profile", "pass a profile.json operator-profiler wrote (`assemble RUN_DIR` rebuilds it)")
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
