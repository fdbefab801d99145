"""The MCP server class: the SDK's `MCPServer`, with every tool listed slim and every call's arguments read strictly.

- registration: a tool that returns a pydantic model gets its slim output schema from the model's fields
  (`slim_output_of`), and the SDK's full JSON schema of the model, which would be cut down anyway, is never
  generated (a third of the server's start-up); its results are still validated against the whole model.
- `tools/list`: each tool's input schema through `strict_input` and its output schema through `slim_output`, for
  every registered tool (computed once: tools do not change once the server runs).
- `tools/call`: a parameter the tool does not declare is refused, naming the ones it does; a value of the wrong
  type is one line naming the parameter and the type wanted, not pydantic's report with its links; an engine error
  raised in a tool's body before its work started is its one line with its remedy, not a crash.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, Icon, InputRequiredResult, ToolAnnotations
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, ValidationError

from mcp_server.errors import ProfilerError
from mcp_server.serve.schemas import parameters, slim_output, slim_output_of, strict_input
from mcp_server.serve.wording import mcp_words


def argument_error(exc: ValidationError) -> str:
    """A tool's arguments that failed validation, in one line: the first problem, with the parameter's name."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "arguments"
    message = str(first["msg"]).removeprefix("Value error, ")
    more = exc.error_count() - 1
    shown = repr(first["input"])
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    return (f"{where}: {message[:1].lower()}{message[1:]} (got {shown})" + (f"; and {more} more" if more else "")
            + " — pass a value of the type the tool's input schema gives")


class StrictServer(MCPServer):
    """`MCPServer` whose tool list is slim and whose calls refuse unknown or ill-typed arguments in one line."""

    _listed: list[MCPTool] | None = None

    def add_tool(self, fn: Callable[..., Any], name: str | None = None, title: str | None = None,
                 description: str | None = None, annotations: ToolAnnotations | None = None,
                 icons: list[Icon] | None = None, meta: dict[str, Any] | None = None,
                 structured_output: bool | None = None) -> None:
        """Register a tool; one returning a pydantic model gets `slim_output_of` it as its output schema."""
        returned = inspect.signature(fn, eval_str=True).return_annotation
        modelled = isinstance(returned, type) and issubclass(returned, BaseModel)
        super().add_tool(fn, name, title, description, annotations, icons, meta,
                         structured_output=False if modelled and structured_output is None else structured_output)
        tool = self._tool_manager.get_tool(name or fn.__name__)
        if modelled and structured_output is None and tool is not None:
            # The SDK reads these live: results are validated against the whole model, and structured.
            tool.fn_metadata.output_model = returned
            tool.fn_metadata.output_schema = slim_output_of(returned)

    async def list_tools(self) -> list[MCPTool]:
        """Every tool, its input schema strict and its output schema slim."""
        if self._listed is None:
            self._listed = [tool.model_copy(update={"input_schema": strict_input(tool.input_schema),
                                                    "output_schema": slim_output(tool.output_schema)})
                            for tool in await super().list_tools()]
        return self._listed

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool: unknown parameters and ill-typed values are refused before it runs."""
        tool = next((t for t in await self.list_tools() if t.name == name), None)
        if tool is not None:
            known = parameters(tool.input_schema)
            unknown = sorted(set(arguments) - set(known))
            if unknown:
                raise ToolError(f"Error executing tool {name}: unknown parameter{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(unknown)} — {name} takes {', '.join(known)}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:  # (an UnexpectedToolError too: the SDK's wrapper of what the tool's body raised)
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(f"Error executing tool {name}: {argument_error(cause)}") from cause
            if isinstance(cause, ProfilerError):  # raised before the tool handed its work to the engine
                raise ToolError(f"Error executing tool {name}: {mcp_words(cause.one_line())}") from cause
            raise
