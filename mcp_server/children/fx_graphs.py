"""Operators of an FX GraphModule run eagerly: `torch.export`'s `.module()`, `torch.fx.symbolic_trace`, torchvision's
feature extractors (standard library and torch only).

Such a module's generated code calls the operators itself, so the forwards of the modules they came from never run
(no module hook fires inside it) and every call comes from a line of code that is no file. Each node of its graph
keeps the module it came from (`nn_module_stack`) and, where it was recorded, the user's line (`stack_trace`); the
call-site mode asks `FxNodes` for the node behind a call and names the call by them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from mcp_server.children.naming import clean_module_path, user_site
from mcp_server.children.sites import UserFrames

FX_CODE_PREFIX = "<eval_with_key>"  # the file name torch.fx gives the code it generates


@dataclass(frozen=True)
class FxNode:
    """What a node of a GraphModule's graph says of the code it came from."""

    module_path: str  # relative to the GraphModule; "" for the GraphModule's own forward
    site: str | None  # `path:line` of the user's code that made it, where the trace recorded a stack


@dataclass
class _Graph:
    module: Any
    nodes: list[Any]
    lines: dict[int, int]  # line of the generated code, from its prologue -> index of the node
    prologue: int


# (the GraphModule, a node's module path under it) -> that module's path as its ranges name it
PathOf = Callable[[Any, str], "str | None"]


class FxNodes:
    """The node of an eagerly run GraphModule behind a torch call, found from the call's frames; called with the
    call's frame, the module path and the line to name it by (`call_sites`' `graph_nodes`)."""

    def __init__(self, frames: UserFrames, path_of: PathOf) -> None:
        self.frames = frames
        self.path_of = path_of
        self._graphs: dict[CodeType, _Graph | None] = {}
        self._nodes: dict[tuple[CodeType, int], FxNode | None] = {}

    def __call__(self, frame: FrameType | None) -> tuple[str | None, str | None] | None:
        """(the path of the module the node behind the call came from, or None for the GraphModule's own forward;
        the user's line it came from, or None where the trace kept no stack); None when no node made the call."""
        found = self.find(frame)
        if found is None:
            return None
        owner, node = found
        return (self.path_of(owner, node.module_path) if node.module_path else None), node.site

    def find(self, frame: FrameType | None) -> tuple[Any, FxNode] | None:
        """(the GraphModule, its node) whose generated line made the torch call that `frame` (the innermost frame
        outside the call) belongs to: the first FX-generated frame from `frame` outwards before any frame of the
        user's code; None when there is none, or the node names no module and no line."""
        while frame is not None:
            code = frame.f_code
            if code.co_filename.startswith(FX_CODE_PREFIX):
                return self._at(frame)
            if self.frames.is_user(code):
                return None
            frame = frame.f_back
        return None

    def _at(self, frame: FrameType) -> tuple[Any, FxNode] | None:
        code = frame.f_code
        if code not in self._graphs:  # the frame's locals are read once per generated function: they are many
            self._graphs[code] = _graph(frame.f_locals.get("self"))
        graph = self._graphs[code]
        if graph is None:
            return None
        key = (code, frame.f_lineno)
        if key not in self._nodes:
            index = graph.lines.get(frame.f_lineno - graph.prologue)
            node = graph.nodes[index] if index is not None and index < len(graph.nodes) else None
            self._nodes[key] = None if node is None else self._described(node)
        found = self._nodes[key]
        return None if found is None else (graph.module, found)

    def _described(self, node: Any) -> FxNode | None:
        if node.op == "call_module":  # that module's forward runs: its own hooks and frames name its calls
            return None
        stack = node.meta.get("nn_module_stack") or {}
        module_path = clean_module_path(str(list(stack.values())[-1][0])) if stack else ""
        site = user_site(node.meta.get("stack_trace"), self.frames.roots)
        if not module_path and site is None:
            return None
        return FxNode(module_path, site)


def _graph(module: Any) -> _Graph | None:
    """What locating a line of `module`'s generated code needs; None when it is no GraphModule, or keeps no map."""
    from torch.fx import GraphModule

    lines = getattr(module, "_lineno_map", None)
    if not isinstance(module, GraphModule) or not isinstance(lines, dict):
        return None
    return _Graph(module, list(module.graph.nodes), lines, int(getattr(module, "_prologue_start", 0) or 0))


def node_module_path(owner: Any, module_path: str, path_of: Callable[[Any], str | None],
                     bare: Callable[[str], bool]) -> str | None:
    """The path of the module a node of the GraphModule `owner` came from, as the module ranges name it: `path_of`
    the innermost module `owner` holds on `module_path` (`torch.export` keeps the model's hierarchy as bare
    containers, and none for a module without parameters or buffers: a GELU), with the rest of the path below it;
    under a root whose descendants' paths do not begin with its name (`bare`), that rest alone."""
    parts = module_path.split(".")
    module, rest = owner, ""
    for i, part in enumerate(parts):
        child = getattr(module, "_modules", {}).get(part)
        if child is None:
            rest = ".".join(parts[i:])
            break
        module = child
    path = path_of(module)
    if path is None or not rest:
        return path
    return rest if bare(path) else f"{path}.{rest}"
