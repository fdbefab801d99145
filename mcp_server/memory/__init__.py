"""Memory: where every byte at the peak of the measured window comes from.

The memory pass (capture/memory.py, children/memory.py) leaves the CUDA caching allocator's snapshots and the
harness's record in the run directory; `build_memory` replays the allocator's history (replay), attributes every
block to its operator, module, phase, call site and category (attribute), groups what is live at the peak
(moments), finds what lowers it (findings), and `write_memory` writes memory.json and its chart.
"""

from __future__ import annotations

from mcp_server.memory.build import build_memory
from mcp_server.memory.run import add_memory_pass, diagnose_out_of_memory, load_memory, memory, write_memory
from mcp_server.memory.text import memory_lines, oom_lines

__all__ = ["add_memory_pass", "build_memory", "diagnose_out_of_memory", "load_memory", "memory", "memory_lines",
           "oom_lines", "write_memory"]
