"""The MCP face's tool registry: the server object and its instructions, the decorator that registers a tool (its
description the docstring, its parameters made from its verb's request model), the request built from a call's
arguments, and the call that hands a tool's request to the engine's facade in a worker thread. Imports no engine
module: `api` is imported on the first call."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

from mcp_server import __version__
from mcp_server.progress import Progress
from mcp_server.schema.flags import FACE_SET, Flag, PathRole, Positional, option_group, usage_error
from mcp_server.schema.requests import (
    TORCHRUN_OPTIONS,
    CaptureOptions,
    Interpreter,
    SummaryRequest,
    TimingOptions,
    ValidateRequest,
)
from mcp_server.serve.interpreter import choose_python
from mcp_server.serve.paths import CLIENT_ROOTS, project_dir, resolve, workload_file
from mcp_server.serve.runner import client_roots, run_engine
from mcp_server.serve.strict import StrictServer

FLOW = """\
Operator Profiler attributes every CUDA kernel of a PyTorch workload to the operator (aten::linear, an
Inductor-fused group) and nn.Module path that launched it, and proves optimizations with evidence.
A workload is a .py file defining get_model_and_input() -> (model, inputs).
Flow: preflight -> profile -> analyze -> top_operators / operator_detail / kernel_detail -> recipes (what a
user gets for free: the winner of each precision tier, the baseline to beat) -> write an optimized copy ->
validate (is it still right?) -> bench (how much faster than eager and than the frontier's winner, with
confidence intervals) -> profile the optimized workload -> compare (which operators moved) -> report.
loop_status says which stage of that loop is next for a workload whose folder holds the loop's files.
Relative paths resolve against the project directory (CLAUDE_PROJECT_DIR, else the server's working
directory); tools read and write only inside it, the client's roots and $OPERATOR_PROFILER_ALLOWED_DIRS.
"""


def _clause(description: str | None) -> str:
    text = (description or "").rstrip(".")
    return text[:1].lower() + text[1:]


def _listed(fields: Mapping[str, FieldInfo]) -> str:
    return "; ".join(f"{name} = {_clause(field.description)}" for name, field in fields.items())


def shared_parameters() -> str:
    """What the parameters several tools share mean, said once for every tool (their schemas leave it out: the
    `INSTRUCTED` verb fields, and the timing and torchrun options, `schemas.SHARED`), from their fields' descriptions
    where one field says it for all."""
    interpreter = _clause(Interpreter.model_fields["python"].description)
    return (
        f"Parameters shared by the tools: python = {interpreter} (default: $OPERATOR_PROFILER_PYTHON, else "
        "<project>/.venv/bin/python, else python3 on PATH; every result says which interpreter and torch ran); output "
        "= the folder to write into (default: a fresh one under <project>/op_runs/); "
        f"timeout_s = {_clause(ValidateRequest.model_fields['timeout_s'].description)}; "
        f"tier = {_clause(ValidateRequest.model_fields['tier'].description)}; "
        f"profile = {_clause(SummaryRequest.model_fields['profile'].description)}; top, limit = how many rows. "
        "Timing (bench, recipes, optimize; each process of a side or a recipe): "
        f"{_listed(TimingOptions.model_fields)}. "
        "Several nodes (profile): "
        f"{_listed({name: CaptureOptions.model_fields[name] for name in TORCHRUN_OPTIONS})}. "
        "Leave out an optional parameter for its default.\n"
    )


INSTRUCTIONS = FLOW + textwrap.fill(shared_parameters(), 116) + "\n"

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
RUNS_WORKLOAD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                open_world_hint=False)
REBUILDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
REPLACES_COUNTERS = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                    open_world_hint=False)
QUERY_LIMIT_S = 120.0
ASSEMBLY_MARGIN_S = 300.0

# Parameters shared by the tools are described once, in INSTRUCTIONS, not in every tool's schema.
INSTRUCTED = frozenset({"python", "output", "timeout_s", "top", "limit", "profile", "tier"})
# Parameters whose value the face chooses from what it is given: the workload's interpreter.
FACE_CHOSEN = frozenset({"python"})
Python = Annotated[str | None, Field()]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound=BaseModel)
G = TypeVar("G", bound=BaseModel)

server = StrictServer(name="operator-profiler", version=__version__, instructions=INSTRUCTIONS)


def tool(
    title: str, annotations: ToolAnnotations, verb: type[BaseModel], name: str | None = None,
    groups: Mapping[str, tuple[str, ...] | None] | None = None, hidden: tuple[str, ...] = (),
    renamed: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Register a tool whose description is its docstring, dedented, and whose parameters are made from its verb's
    request model (`generated`): the function declares only the context and any parameter of the face's own, and
    takes the rest as `**values` (`face_request` turns them into the request). `groups` names the option-group
    fields whose own fields are parameters too (all, or the tuple named); `hidden`, the fields the face sets itself;
    `renamed`, a field the tool calls otherwise (the tool receives it under the field's name)."""

    def register(fn: F) -> F:
        names = dict(renamed or {})
        face: Callable[..., Any] = fn
        if names:
            back = {shown: field for field, shown in names.items()}

            async def face(ctx: Context, **arguments: Any) -> Any:
                return await fn(ctx, **{back.get(key, key): value for key, value in arguments.items()})

        face.__signature__ = generated(fn, verb, groups or {}, hidden, names)  # type: ignore[attr-defined]
        server.add_tool(face, name=name or fn.__name__, title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                        annotations=annotations)
        return fn

    return register


def generated(fn: Callable[..., Any], model: type[BaseModel], groups: Mapping[str, tuple[str, ...] | None],
              hidden: tuple[str, ...] = (), renamed: Mapping[str, str] | None = None) -> inspect.Signature:
    """`fn`'s signature with its `**values` replaced by one keyword parameter per field of `model`: its type (a path
    is a string the face resolves), bounds, default and description (the one place each is written; the parameters
    the instructions describe, `INSTRUCTED`, take no description). An option group's fields stand for it where
    `groups` names it. The interpreter (`FACE_CHOSEN`) is an optional string the face chooses from. A parameter of
    `fn`'s own named like a field, or a group neither in `groups` nor `hidden`, is a TypeError when the tool is
    registered: every parameter of a verb comes from its model."""
    signature = inspect.signature(fn, eval_str=True)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    clash = sorted({p.name for p in own} & set(model.model_fields))
    if clash:
        raise TypeError(f"tool {fn.__name__}: parameter {', '.join(clash)} is a field of {model.__name__}: "
                        "the model declares it")
    params = list(own)
    for name, field in model.model_fields.items():
        if name in FACE_SET or name in hidden:
            continue
        if name in FACE_CHOSEN:
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Python))
            continue
        group = option_group(field)
        if group is None:
            params.append(_parameter((renamed or {}).get(name, name), field))
        elif name in groups:
            only = groups[name]
            params += [
                inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=info.annotation)
                for option, info in group.model_fields.items() if only is None or option in only
            ]
        else:
            raise TypeError(f"tool {fn.__name__}: option group {name} of {model.__name__} is neither in groups nor "
                            "hidden")
    return signature.replace(parameters=params)


def _parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    """The keyword parameter for one field: a path as a string; bounds and description from the field."""
    annotation = _given(field.annotation)
    bounds = [item for item in field.metadata if not isinstance(item, (Flag, Positional, PathRole))]
    description = None if name in INSTRUCTED else field.description
    if bounds or description:
        metadata = (annotation, *bounds, Field(description=description))
        annotation = Annotated[metadata]  # a tuple: Annotated[type, *metadata]
    default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _given(annotation: Any) -> Any:
    """The type a client gives a field in: a path as a string."""
    if annotation is Path:
        return str
    if get_origin(annotation) in (Union, UnionType):
        return Union[tuple(str if arg is Path else arg for arg in get_args(annotation))]  # noqa: UP007 - built
    return annotation


def options(model: type[G], values: Mapping[str, Any]) -> G:
    """An option group from a tool's arguments: the fields of `model` among them (the others keep their defaults)."""
    return request(model, **{name: values[name] for name in model.model_fields if name in values})


def face_request(model: type[R], values: Mapping[str, Any], **given: Any) -> R:
    """`model`'s request from a tool's arguments: each path resolved against the project and confined (its
    `PathRole`: a workload must be an existing file), the interpreter chosen (`choose_python`), the project set,
    each option group built from its fields among the arguments; `given` sets fields the face computed."""
    fields: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name in given:
            fields[name] = given[name]
        elif name == "project":
            fields[name] = project_dir()
        elif name in FACE_CHOSEN:
            fields[name] = choose_python(values.get(name))
        elif (group := option_group(field)) is not None:
            if any(option in values for option in group.model_fields):
                fields[name] = options(group, values)
        elif name in values:
            fields[name] = _resolved(values[name], field)
    return request(model, **fields)


def _resolved(value: Any, field: FieldInfo) -> Any:
    role = next((item for item in field.metadata if isinstance(item, PathRole)), None)
    if role is None or value is None:
        return value
    return workload_file(value, role.what) if role.workload else resolve(value, role.what)


def facade() -> ModuleType:
    """The engine's facade, imported on first use so that start-up stays light."""
    from mcp_server import api

    return api


def request(model: type[R], **values: Any) -> R:
    """A verb's request, or the UsageError (a ToolError with its remedy) naming the parameter that is wrong."""
    try:
        return model(**values)
    except ValidationError as exc:
        raise usage_error(exc) from exc


async def call(ctx: Context | None, verb: str, limit_s: float, make: Callable[[], BaseModel], label: str = "") -> Any:
    """Run facade verb `verb` on the request `make` builds (in the worker thread, so that a bad path or value is
    a ToolError with its remedy), within `limit_s` (run_engine)."""

    def work(progress: Progress, cancel: Any) -> Any:
        return getattr(facade(), verb)(make(), progress, cancel)

    CLIENT_ROOTS.set(await client_roots(ctx))  # the worker thread runs in a copy of this context
    return await run_engine(ctx, label or verb, work, limit_s)
