"""What `tools/list` says of each tool, slimmed for an agent that loads it into its context every session, and the
strict reading of a call's arguments.

Every tool's output schema passes through `slim_output`: the names of the result's fields (the structured content
itself is whole, and validated against the result model on the server). Every input schema passes through
`strict_input`: no pydantic titles, an optional `X | None` declared as X, unknown parameters refused
(`additionalProperties: false`). Both are plain functions of a JSON schema, so every tool registered, however it
was, gets them (`serve.strict.StrictServer.list_tools`).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from mcp_server.schema.requests import TORCHRUN_OPTIONS, TimingOptions

Schema = dict[str, Any]
_REF = "#/$defs/"
# Parameters several tools share and the server's instructions describe once (serve/tools.py): the timing options
# and torchrun's own options.
SHARED = frozenset(TimingOptions.model_fields) | frozenset(TORCHRUN_OPTIONS)


def _target(node: Schema, defs: Schema) -> Schema:
    """`node`, or the definition its `$ref` points at."""
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF):
        target = defs.get(ref.removeprefix(_REF), {})
        return target if isinstance(target, dict) else {}
    return node


def slim_output(schema: Schema | None) -> Schema | None:
    """An output schema cut to the names of its root's fields: what an agent reads the structured content by, at a
    fraction of the size (types, nested models, descriptions and `$defs` are left out: the content itself says
    them, and the server validates it against the whole result model)."""
    if not schema:
        return schema
    root = _target(schema, schema.get("$defs", {}))
    return {"type": "object", "properties": {name: {} for name in root.get("properties", {})}}


def slim_output_of(model: type[BaseModel]) -> Schema:
    """`slim_output` of a pydantic model's JSON schema, straight from its fields (as serialised: by alias)."""
    names = [field.alias or name for name, field in model.model_fields.items()]
    return {"type": "object", "properties": {name: {} for name in names}}


def strict_input(schema: Schema, shared: frozenset[str] = SHARED) -> Schema:
    """An input schema without pydantic's titles and `"default": null`, an optional `X | None` declared as X (left
    out, it takes its default; null is still accepted), no description of the `shared` parameters (the instructions
    describe them once), and unknown parameters refused."""
    slim = _slimmed(copy.deepcopy(schema))
    for name, prop in slim.get("properties", {}).items():
        if name in shared and isinstance(prop, dict):
            prop.pop("description", None)
    slim["additionalProperties"] = False
    return slim


def _slimmed(node: Any) -> Any:
    if isinstance(node, list):
        return [_slimmed(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: value for key, value in node.items()
            if not (key == "title" and isinstance(value, str)) and not (key == "default" and value is None)}
    options = node.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:  # optional: left out
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other, dict) and isinstance(other.get("type"), str):
            del node["anyOf"]
            node.update(other)
    if "properties" in node and isinstance(node["properties"], dict):  # keys are parameter names, kept as they are
        node["properties"] = {name: _slimmed(value) for name, value in node["properties"].items()}
        return {key: (value if key == "properties" else _slimmed(value)) for key, value in node.items()}
    return {key: _slimmed(value) for key, value in node.items()}


def parameters(schema: Schema) -> list[str]:
    """The parameter names an input schema declares."""
    return list(schema.get("properties", {}))
