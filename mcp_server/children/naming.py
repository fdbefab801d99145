"""How a model, its modules and its lines are named: the root by its class (a TorchScript module's or an exported
program's by the model's), a module path as Dynamo or `torch.export` writes it cleaned, the user's line of an FX node's
recorded stack (standard library and torch only)."""

from __future__ import annotations

import os
import re
from typing import Any

from mcp_server.children.sites import is_core

SCRIPTED = "RecursiveScriptModule"  # the class of a module `torch.jit.script` compiled: named by its own class


def root_module_name(model: Any) -> str:
    """The module path that names the model itself (its class): kernels of its own forward outside every
    submodule, and the optimizer's, which updates the parameters of all of them."""
    model = getattr(model, "_orig_mod", model)
    bases = type(model).__bases__
    # FSDP2's `fully_shard` makes a class of its own, FSDP<Class>(FSDPModule, Class): the model keeps its class's name
    name = bases[-1].__name__ if len(bases) == 2 and bases[0].__name__ == FSDP_MODULE else type(model).__name__
    if name == SCRIPTED:
        return str(model.original_name)
    return (traced_root_class(model) or name) if name == GRAPH_MODULE else name


FSDP_MODULE = "FSDPModule"
GRAPH_MODULE = "GraphModule"  # the class of `torch.export`'s `.module()` (`symbolic_trace` keeps the model's name)


def traced_root_class(module: Any) -> str | None:
    """The class name of the model `torch.export` traced into the GraphModule `module`, from its nodes' module
    stacks; None when they do not name it."""
    for node in _nodes(module):
        for path, mtype in (node.meta.get("nn_module_stack") or {}).values():
            if not clean_module_path(str(path)):
                return class_name(mtype)
    return None


def traced_classes(module: Any) -> dict[str, str]:
    """Module path -> class name of every module a GraphModule's nodes came from (`nn_module_stack`): the classes
    as traced, where the GraphModule holds bare containers."""
    found: dict[str, str] = {}
    for node in _nodes(module):
        for path, mtype in (node.meta.get("nn_module_stack") or {}).values():
            if clean_module_path(str(path)):
                found.setdefault(clean_module_path(str(path)), class_name(mtype))
    return found


def _nodes(module: Any) -> list[Any]:
    """The nodes of `module`'s graph where it is an FX GraphModule (a model of another kind may have a `graph`)."""
    from torch.fx import GraphModule

    return list(module.graph.nodes) if isinstance(module, GraphModule) else []


def class_name(mtype: Any) -> str:
    """A module stack's type (a class, or its qualified name as a string) -> the class name."""
    return getattr(mtype, "__name__", None) or str(mtype).rsplit(".", 1)[-1]


_MODEL_SOURCE = re.compile(r"^L\['self'\]\.?|^L\['[^']+'\]\.__self__\.?")


def clean_module_path(raw: str, root: str = "") -> str:
    """`L['self'].features._modules['0'].conv` or `L['self'].features[0]` -> `features.0.conv`; the model
    itself (`L['self']`) -> `root`. A forward set on the instance (a wrapper closing over the bound forward,
    e.g. `autocast_in_forward`) reaches the model as `L['forward'].__self__`: the same paths."""
    path = _MODEL_SOURCE.sub("", raw)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip(".") or root


_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_site(stack_trace: str | None, roots: tuple[str, ...]) -> str | None:
    """`path:line` of the innermost user frame of an FX node's `stack_trace` (frames listed outermost first);
    without one (a library's model), of the innermost third-party library frame (`UserFrames.site`'s rule)."""
    if not stack_trace:
        return None
    library = None
    for path, line in reversed(_STACK_FRAME.findall(stack_trace)):
        if path.startswith("<"):
            continue
        real = os.path.realpath(path)
        if not real.startswith(roots):
            return f"{path}:{line}"
        if library is None and not is_core(real):
            library = f"{path}:{line}"
    return library
