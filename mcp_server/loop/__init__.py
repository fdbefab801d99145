"""The `/optimize` loop's state: its stage table, the provenance the tools record, and which stage is next."""

from mcp_server.loop.stages import STAGES, Stage
from mcp_server.loop.state import Recorder, is_loop_folder, read_state
from mcp_server.loop.status import loop_status

__all__ = ["STAGES", "Recorder", "Stage", "is_loop_folder", "loop_status", "read_state"]
