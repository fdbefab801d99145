"""The MCP face's tool registry: the server object and its instructions, the decorator that registers a tool (its
description the docstring, its option-group parameters made from a request model), and the call that hands a tool's
request to the engine's facade in a worker thread. Imports no engine module: `api` is imported on the first call."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from mcp_server import __version__
from mcp_server.progress import Progress
from mcp_server.schema.flags import Flag, Positional, usage_error
from mcp_server.serve.paths import CLIENT_ROOTS
from mcp_server.serve.runner import client_roots, run_engine
from mcp_server.serve.strict import StrictServer

INSTRUCTIONS = """\
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
Parameters shared by the tools: python = the interpreter that runs the workload (default:
$OPERATOR_PROFILER_PYTHON, else <project>/.venv/bin/python, else python3 on PATH; every result says which
interpreter and torch ran); output = the folder to write into (default: a fresh one under <project>/op_runs/);
timeout_s = seconds each child process may run; tier = exact (fp32, TF32 off) or reduced (TF32/bf16/fp16 within
1e-2); profile, baseline, optimized (compare) = a profile.json or the run directory holding it; top, limit = how
many rows. Timing (bench, recipes, optimize; each process of a side or a recipe): warmup = calls after the
compiling one; calls = at most this many latency calls, each alone and synchronised; queued = at most this many
calls per back-to-back block, one synchronisation each; blocks = back-to-back blocks; budget_s = seconds of timed
calls aimed at (fewer calls when slow); input_sets = input sets rotated; seed = the seed of weights and inputs;
throughput = state and rank by back-to-back, not latency. Several nodes (profile): nnodes, node_rank, master_addr,
master_port, rdzv_backend, rdzv_endpoint, rdzv_id are torchrun's options of the same names. Leave out an optional
parameter for its default.
"""

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
# Parameters whose default the face chooses where the request cannot: the workload's interpreter.
FACE_CHOSEN = frozenset({"python"})
Python = Annotated[str | None, Field()]
Output = Annotated[str | None, Field()]
Positive = Annotated[int, Field(ge=1)]
ProfileRef = Annotated[str, Field()]

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R", bound=BaseModel)

server = StrictServer(name="operator-profiler", version=__version__, instructions=INSTRUCTIONS)


def tool(
    title: str, annotations: ToolAnnotations, name: str | None = None, options: type[BaseModel] | None = None,
    only: tuple[str, ...] | None = None, verb: type[BaseModel] | None = None,
) -> Callable[[F], F]:
    """Register a tool whose description is its docstring, dedented. With `verb`, each parameter named like a field
    of that request model takes the field's description (`described`). With `options`, the tool's `**options`
    stands for one parameter per field of that request model (its type, bounds, default and description), or per
    field named in `only`."""

    def register(fn: F) -> F:
        if verb is not None:
            fn.__signature__ = described(fn, verb)  # type: ignore[attr-defined]
        if options is not None:
            fn.__signature__ = with_options(fn, options, only)  # type: ignore[attr-defined]
        server.add_tool(fn, name=name, title=title, description=inspect.cleandoc(fn.__doc__ or ""),
                        annotations=annotations)
        return fn

    return register


def described(fn: Callable[..., Any], model: type[BaseModel]) -> inspect.Signature:
    """`fn`'s signature, each parameter named like a field of `model` bounded and described by that field (the one
    place its bounds and description are written); the parameters the instructions describe (`INSTRUCTED`) take
    the bounds alone. A parameter whose default is not its field's (but for `FACE_CHOSEN`) is a TypeError when the
    tool is registered: the server does not start with a tool that disagrees with its verb."""
    signature = inspect.signature(fn, eval_str=True)
    params = []
    for param in signature.parameters.values():
        field = model.model_fields.get(param.name)
        if field is not None and param.name not in FACE_CHOSEN and param.kind is not inspect.Parameter.VAR_KEYWORD:
            expected = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
            if param.default != expected:
                raise TypeError(f"tool {fn.__name__}: parameter {param.name} defaults to {param.default!r}, "
                                f"its field of {model.__name__} to {expected!r}")
        if field is not None:
            bounds = [item for item in field.metadata if not isinstance(item, (Flag, Positional))]
            description = None if param.name in INSTRUCTED else field.description
            if bounds or description:
                metadata = (param.annotation, *bounds, Field(description=description))
                param = param.replace(annotation=Annotated[metadata])  # a tuple: Annotated[type, *metadata]
        params.append(param)
    return signature.replace(parameters=params)


def with_options(fn: Callable[..., Any], model: type[BaseModel], only: tuple[str, ...] | None = None
                  ) -> inspect.Signature:
    """`fn`'s signature with its `**options` replaced by keyword parameters, one per field of `model`: each takes
    the field's type, and the field itself (default, bounds, description) as its default."""
    signature = inspect.signature(fn, eval_str=True)
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=field, annotation=field.annotation)
               for name, field in model.model_fields.items() if only is None or name in only]
    return signature.replace(parameters=params)


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
