"""The MCP face: the tools (`app`), their registry (`tools`), and its helpers: resolving the client's paths
against its project, choosing the workload's interpreter, and running a blocking facade call from an async tool.
None imports the engine at start-up, so the server starts fast; `mcp_server.api` is imported on a tool's first use.
"""
