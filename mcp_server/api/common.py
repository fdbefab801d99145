"""The facade's shared pieces: the cancel type, the program's name, recording loop checkpoints."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from mcp_server.loop import Recorder
from mcp_server.loop.state import state_path
from mcp_server.progress import Progress

Cancel = threading.Event | None
PROGRAM = "operator-profiler"


def record(loop: Recorder, written: Iterable[Path | str], progress: Progress) -> None:
    """Record the loop checkpoints among `written` in loop_state.json when the tool wrote into a loop folder."""
    recorded = loop.record(Path(p) for p in written)
    if recorded:
        progress(f"{loop.tool}: recorded {', '.join(recorded)} in {state_path(loop.folder)}")
