"""Memory: where every byte at the peak of the measured window comes from.

The memory pass (capture/memory.py, children/memory.py) leaves the CUDA caching allocator's snapshots and the
harness's record in the run directory; `build_memory` replays the allocator's history (replay), attributes every
block to its operator, module, phase, call site and category (attribute), groups what is live at the peak
(moments), finds what lowers it (findings), and `write_memory` writes memory.json and its chart.
"""
