"""How a request's fields are spelt on the command line, and how a request that failed validation is told.

A field's CLI spelling is `--<name-with-dashes>` (a boolean that defaults to true: `--no-<name>`) unless a `Flag`
in its metadata says otherwise; a required field is a positional argument (its `Positional` names its metavar).
Its help is the field's description: every face reads it from there. A path field's `PathRole` says what it names.
"""

from __future__ import annotations

from collections.abc import Callable
from types import UnionType
from typing import NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo

from mcp_server.errors import UsageError


class Flag(NamedTuple):
    """A field's command-line spelling, where it is not `--<name-with-dashes>`; `repeat` for a list option, `short`
    for a one-letter alias (`-o`)."""

    name: str
    repeat: bool = False
    short: str | None = None


class Positional(NamedTuple):
    """How a required field, a positional argument on the command line, is named in usage lines."""

    metavar: str


class PathRole(NamedTuple):
    """What a path field names (`what`, in a face's errors), for a face that resolves the paths it is given (the MCP
    server resolves them against the client's project and confines them); `workload`: an existing .py file."""

    what: str
    workload: bool = False


FACE_SET = frozenset({"project", "command_line"})
"""Request fields every face sets itself (the project is the user's working directory or the client's; the command
line is what the CLI was given): neither a flag nor an MCP parameter."""


def option_group(field: FieldInfo) -> type[BaseModel] | None:
    """The option-group model a field holds (`CaptureOptions`, `NcuOptions | None`, the `Interpreter`), or None: a
    face sets a group from its own fields, not as one value."""
    kinds = get_args(field.annotation) if get_origin(field.annotation) in (Union, UnionType) else (field.annotation,)
    found = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
    return found[0] if found else None


class Request(BaseModel):
    """A verb's request or an option group: unknown fields refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def cli_flag(name: str, field: FieldInfo) -> Flag:
    """The command-line spelling of field `name`: its `Flag`, `--no-<name>` for a boolean that defaults to true,
    else `--<name-with-dashes>`."""
    for item in field.metadata:
        if isinstance(item, Flag):
            return item
    dashed = name.replace("_", "-")
    repeat = field.annotation == tuple[str, ...]
    return Flag(f"--no-{dashed}" if field.default is True else f"--{dashed}", repeat=repeat)


def flag_of(model: type[BaseModel], name: str) -> str:
    """The command-line spelling of `model`'s field `name` (a printed command spells its flags with it)."""
    return cli_flag(name, model.model_fields[name]).name


def usage_error(exc: ValidationError, spell: Callable[[str], str] = str) -> UsageError:
    """The first problem of a request that failed validation, as a one-line UsageError; `spell` names a field as
    the face shows it (`--warmup-iters` on the command line, `warmup_iters` over MCP)."""
    error = exc.errors()[0]
    name = str(error["loc"][-1]) if error["loc"] else "request"
    if error["type"] == "literal_error":
        choices = str(error.get("ctx", {}).get("expected", "")).replace("'", "").replace(" or ", ", ")
        return UsageError(f"unknown {name.replace('_', ' ')} {error['input']!r}", f"choose one of {choices}")
    message = str(error["msg"]).removeprefix("Value error, ")
    return UsageError(f"{spell(name)}: {message[:1].lower()}{message[1:]}", "pass a valid value (see --help)")


def cli_flags(options: BaseModel) -> list[str]:
    """The command-line arguments that ask for `options`: one per field that differs from its default (a required
    field is a positional argument: the caller places it)."""
    argv: list[str] = []
    for name, field in type(options).model_fields.items():
        value = getattr(options, name)
        if field.is_required() or value == field.default:
            continue
        flag = cli_flag(name, field).name
        if isinstance(value, bool):
            argv.append(flag)
        elif isinstance(value, dict):
            for key, item in value.items():
                argv += [flag, f"{key}={item:g}"]
        elif isinstance(value, (tuple, list)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv
