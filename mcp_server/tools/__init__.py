"""Helpers behind the MCP server's tools: path resolution, interpreter choice, the worker-thread runner.

`paths`, `interpreter` and `runner` import no engine module, so the server starts fast; `actions` and
`queries` hold the engine calls and are imported on a tool's first use.
"""
