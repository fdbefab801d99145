"""`python -m mcp_server`: serve the Operator Profiler's MCP tools over stdio."""

from mcp_server.serve.app import main

if __name__ == "__main__":
    main()
