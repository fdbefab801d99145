"""Child processes of the engine: running one (`run_child`), the environment of the workload's interpreter
(`interpreter_env`, with its bytecode cache), and the child scripts' command lines."""

from mcp_server.process.bytecode import interpreter_env, uses_cache
from mcp_server.process.child import EarlyStop, now_iso, run_child
from mcp_server.process.child_scripts import child_command, child_script

__all__ = ["EarlyStop", "child_command", "child_script", "interpreter_env", "now_iso", "run_child", "uses_cache"]
